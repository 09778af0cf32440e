-- A PER draw made by the server, for clients without a replica (FCALL rb_sample_per: other
-- languages, redis-cli): with replacement, item i with probability (p_i + eps)^alpha /
-- sum_j (p_j + eps)^alpha at this call, from the buffer's snapshot and the log after it
-- (the priorities' only copy, lua/_masslog.lua), with no per-item structure: each draw is
-- made from the snapshot's law (a page in proportion to its total mass, then an item of
-- the page by rejection against the page's largest mass) and corrected to the current
-- law by the changes the log holds since (correct_draw's rounds, lua/_correct.lua: with
-- probability D / (T + D) an item the log names, in proportion to its mass now, else the
-- snapshot's draw if the log does not name it, else another round).
-- @include common
-- @include masslog
-- @include items
-- @include correct
-- @include snapshot
-- @keys 14
-- @retry draw
-- KEYS[1] meta  KEYS[2..13] the buffer's other keys, in BufferKeys.all_keys() order
-- KEYS[14] snap
-- ARGV[1] n (at most RB_SERVER_DRAWS)  ARGV[2] uniforms in [0, 1), packed 6 bytes each
--   (see uniform_at; at most 64 per draw): the draws consume them in turn (a draw takes
--   about 5, more where the log changed much of the mass) and stop when they run out, so
--   the call may return fewer than n  ARGV[3] "1" = also return the blobs
-- Records the draws returned as any sample does (sampled, uses, max_use).
-- Returns {count, length, ids (comma-separated), priorities now (comma-separated), blob_1..}
-- (blobs only when asked). No probabilities: the server keeps no sum of the masses.
-- Work: the log since the snapshot (at most one catch-up reply's rows) and a few page
-- reads per draw.
-- Errors: RB_NOBUF, RB_CONFIG (no PER), RB_NOSNAP (no snapshot of this epoch: any Python
-- process that samples the buffer, or `redisbuf inspect NAME --priority ID`, writes one),
-- RB_BEHIND (the log since the snapshot is longer than one command reads: a following
-- sampler writes one every max(5000, length / 8) rows), RB_EMPTY (no item has mass),
-- RB_LIMIT.
local RB_SERVER_DRAWS = 256
local K = buffer_keys(KEYS)
local snap = KEYS[14]
local n = tonumber(ARGV[1])
if n == nil or n < 0 or n ~= math.floor(n) then
  return fail('RB_INVALID', 'ARGV[1] must be the number of draws, got ' .. tostring(ARGV[1]))
end
if n > RB_SERVER_DRAWS or #(ARGV[2] or '') > 6 * 64 * math.max(n, 1) then
  return fail('RB_LIMIT', 'one command draws at most ' .. RB_SERVER_DRAWS
    .. ' items, with at most 64 uniforms each')
end
local conf = redis.call('HMGET', K.meta, 'capacity', 'mass', 'log_epoch', 'per_alpha',
  'per_eps', 'log_truth')
if not conf[1] then return fail('RB_NOBUF', 'buffer meta ' .. K.meta .. ' does not exist') end
if conf[2] ~= 'per' or conf[6] ~= '1' then
  return fail('RB_CONFIG', 'buffer ' .. K.meta .. ' has no PER priorities (use PERSampler)')
end
local alpha, eps = tonumber(conf[4]) or 1, tonumber(conf[5]) or 0
local S = snapshot_open(snap, conf[3])
if not S or S.header['rule'] ~= 'per' then
  return fail('RB_NOSNAP', 'buffer ' .. K.meta .. ' has no snapshot of its priorities yet'
    .. ' (any Python process sampling it writes one)')
end
local behind = masslog_behind(K, conf[3], tonumber(S.header['version']), S.header['stamp'])
local version = tonumber(behind[3])
if tonumber(S.header['version']) ~= version
    and (#behind == 4 or #behind - 4 ~= version - tonumber(S.header['version'])) then
  return fail('RB_BEHIND', 'the log after the snapshot of ' .. K.meta .. ' is longer than one'
    .. ' command reads; a following sampler writes a new snapshot')
end
local entries = {}
for i = 5, #behind do entries[#entries + 1] = behind[i] end
local touched = touched_masses(entries, true, alpha, eps, 0)
if not touched then
  return fail('RB_NOSNAP', 'buffer ' .. K.meta .. ' was changed whole since its snapshot')
end
local list, masses, open, scores = touched[1], touched[2], touched[3], touched[4]
local live, cumulative, changed = {}, {}, 0
for _, id in ipairs(list) do
  if masses[id] > 0 then
    changed = changed + masses[id]
    live[#live + 1] = id
    cumulative[#live] = changed
  end
end
-- the pages' masses: total and largest, as the snapshot's writer computed them
local w = redis.call('HGET', snap, 'w') or ''
if string.sub(w, 1, 8) ~= S.token then
  return fail('RB_NOSNAP', 'the snapshot of ' .. K.meta .. ' was replaced meanwhile')
end
local page_total, page_top, page_cumulative, total = {}, {}, {}, 0
for i = 9, #w, 16 do
  local k = #page_total + 1
  page_total[k], page_top[k] = le_double_at(w, i), le_double_at(w, i + 8)
  total = total + page_total[k]
  page_cumulative[k] = total
end
if total + changed <= 0 or not (total + changed < math.huge) then
  return fail('RB_EMPTY', 'no item of ' .. K.meta .. ' has a non-zero PER mass')
end
local q = changed / (total + changed)
local uniforms, used = ARGV[2] or '', 0
local function uniform()
  if 6 * (used + 1) > #uniforms then return nil end
  used = used + 1
  return uniform_at(uniforms, used)
end
local function pick(cum, count, target)  -- the first cumulative value above target
  local lo, hi = 1, count
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if cum[mid] > target then hi = mid else lo = mid + 1 end
  end
  return lo
end
-- One draw of the snapshot's law: an id (12 digits) and its snapshot score, or nil when the
-- uniforms ran out.
local function snapshot_draw()
  local u = uniform()
  if not u then return nil end
  local k = pick(page_cumulative, #page_cumulative, u * total)
  local page = snapshot_page(S, k - 1)
  if not page then return nil end
  while true do
    local a, b = uniform(), uniform()
    if not b then return nil end
    local id, score = snapshot_item(S, k - 1, math.floor(a * page.count))
    if id and b * page_top[k] < mass_of(score, true, alpha, eps, 0) then
      return id_str(id), score
    end
  end
end
local ids, priorities, known = {}, {}, {}
local out_of_uniforms = false
for _ = 1, n do
  local id, score
  while true do
    local coin = uniform()
    if not coin then out_of_uniforms = true break end
    if coin < q then
      local target = uniform()
      if not target then out_of_uniforms = true break end
      id = live[pick(cumulative, #live, target * changed)]
      if open[id] then
        if known[id] == nil then known[id] = redis.call('HEXISTS', K.items, id) == 1 end
        if not known[id] then id = nil end  -- never stored there: a fresh round
      end
      if id then
        score = scores[id]
        break
      end
    else
      id, score = snapshot_draw()
      if not id then out_of_uniforms = true break end
      if masses[id] == nil then break end  -- untouched: the snapshot's score is its own
      id = nil  -- touched: another round
    end
  end
  if out_of_uniforms then break end
  ids[#ids + 1] = id
  priorities[#priorities + 1] = type(score) == 'number' and fmt(score) or fmt(to_number(score))
end
local out = {#ids, redis.call('ZCARD', K.order), table.concat(ids, ','),
  table.concat(priorities, ',')}
if ARGV[3] == '1' and #ids > 0 then
  local blobs = hmget_chunked(K.items, ids)
  for i = 1, #ids do out[#out + 1] = blobs[i] end
end
record_draws(K, ids)
return out
