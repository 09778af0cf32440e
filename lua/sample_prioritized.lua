-- Commit a prioritized draw made by a sampling process from its replica of the buffer's
-- scores (redisbuf/sampling/replica.py): check that the replica was current, or correct the
-- draw to the current law, record the draws and optionally return the blobs, in one
-- atomic call. The same script serves softmax of log-rewards and PER.
-- @include common
-- @include masslog
-- @include items
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order
-- ARGV[1] "softmax" or "per" (the rule the replica drew by)  ARGV[2] its log_epoch
-- ARGV[3] its log_version  ARGV[4] its log_stamp (the stamp of the entry at its version)
-- ARGV[5] mode: "exact": the draw stands only if the log is at the replica's version and
--   stamp (then it follows every change made before this call, whatever it drew);
--   "correct" (draws with replacement): as "exact" when nothing changed since; otherwise
--   the draw is corrected here to the current law (see correct_draw) and stands
-- ARGV[6] "1" = also return blobs
-- ARGV[7] the drawn ids, packed (see unpack_ids; may repeat)  ARGV[8] their width
-- "correct": also ARGV[9] S, the spare draws per draw  ARGV[10] two uniforms per draw,
--   packed 6 bytes each (see uniform_at)  ARGV[11] the replica's total mass  ARGV[12] its
--   softmax reference (masses exp(log_reward - ref); "0" under PER); ARGV[7] then holds
--   the candidates: 1 + S per draw (the draw, then S more draws of the replica), draw
--   after draw
-- Returns {1, length, per_sum, per_nonzero, ids, epoch, version, stamp, count,
-- blob_1..blob_count, entry_1..} when the draw stands: ids "" when it stands as sent,
-- else the corrected draw (ids comma-separated), with the log entries after the
-- replica's version (its catch-up) after the blobs (count of them: 0 unless asked, or
-- for a corrected draw not asked, n, nil but where the draw moved from its candidate);
-- per_sum / per_nonzero: the mean non-zero PER priority. {3, epoch, version, stamp, ids,
-- entries...} when a corrected draw has holes: ids as above with '' at each position
-- whose candidates were all touched; nothing is recorded, and the caller, caught up by
-- the entries, fills each hole with a draw among the items they do not name and commits
-- the whole draw again. Else the replica's catch-up (masslog_behind): {0, epoch, version,
-- stamp, entries...}. The work is bounded: a
-- correction reads at most the entries one catch-up reply carries (masslog_behind).
-- Errors: RB_NOTREE (prioritized sampling, or PER for "per", is not on), RB_CONFIG (the
-- buffer samples by the other rule), RB_LIMIT (more than RB_MAX_ITEMS draws).

local function split(text)
  local out = {}
  for part in string.gmatch(text, '[^,]+') do out[#out + 1] = part end
  return out
end

-- The mass of a logged score (text; "nan": not present) under the rule.
local function mass_of(text, per, alpha, eps, ref)
  if text == 'nan' then return 0 end
  local score = to_number(text)
  if per then
    local base = score + eps
    if base <= 0 then return 0 end
    return base ^ alpha
  end
  if score == -math.huge then return 0 end
  return math.exp(score - ref)
end

-- The draw of a replica at an earlier version corrected to the current law, given the
-- log entries since that version: the items they name ("touched": added, re-scored or
-- removed) are the only ones whose mass changed, and the entries give each one's score
-- at that version (its first row's old) and now (its last row's new). Each draw
-- independently: with probability (mass now of the touched items) / (total mass now), a
-- touched item in proportion to its mass now (its first uniform decides, its second
-- picks); else a candidate not touched: its own first, else the first unused one of the
-- spare pool (every candidate is an independent draw of the replica, whose masses are
-- still those of the untouched items, so among them they follow the current law); when
-- those run out too, a hole ('') that the caller fills with a draw among the untouched
-- items (returned second: whether there is one). Nil when an entry is an X or no mass is
-- left.
local function correct_draw(entries, per, alpha, eps, ref, total, candidates, spares,
                            uniforms)
  local first_old, last_new, list = {}, {}, {}
  for _, entry in ipairs(entries) do
    if string.sub(entry, 1, 1) == 'X' then return nil end
    local p1 = string.find(entry, '|', 3, true)
    local p2 = string.find(entry, '|', p1 + 1, true)
    local p3 = string.find(entry, '|', p2 + 1, true)
    local p4 = string.find(entry, '|', p3 + 1, true)
    local ids = split(string.sub(entry, p2 + 1, p3 - 1))
    local old = split(string.sub(entry, p3 + 1, p4 - 1))
    local new = split(string.sub(entry, p4 + 1))
    for i, id in ipairs(ids) do
      if first_old[id] == nil then
        first_old[id] = old[i] or 'nan'
        list[#list + 1] = id
      end
      last_new[id] = new[i] or new[1] or 'nan'
    end
  end
  local live, cumulative, changed = {}, {}, 0
  for _, id in ipairs(list) do
    total = total + mass_of(last_new[id], per, alpha, eps, ref)
      - mass_of(first_old[id], per, alpha, eps, ref)
    local m = mass_of(last_new[id], per, alpha, eps, ref)
    if m > 0 then
      changed = changed + m
      live[#live + 1] = id
      cumulative[#live] = changed
    end
  end
  if total <= 0 or changed > total * (1 + 1e-9) then return nil end
  local width = 1 + spares
  local n = #candidates / width
  local out, used, pool, holes = {}, {}, 1, false
  local function untouched(k)
    local id = candidates[k]
    return first_old[id] == nil and not used[k]
  end
  for j = 1, n do
    if #live > 0 and uniform_at(uniforms, 2 * j - 1) * total < changed then
      local target = uniform_at(uniforms, 2 * j) * changed
      local lo, hi = 1, #live
      while lo < hi do  -- the first cumulative mass above the target
        local mid = math.floor((lo + hi) / 2)
        if cumulative[mid] > target then hi = mid else lo = mid + 1 end
      end
      out[j] = live[lo]
    else
      for k = width * (j - 1) + 1, width * j do
        if untouched(k) then
          out[j], used[k] = candidates[k], true
          break
        end
      end
      if not out[j] then  -- its own candidates were all touched: one from the spare pool
        while pool <= #candidates and not untouched(pool) do pool = pool + 1 end
        if pool <= #candidates then
          out[j], used[pool] = candidates[pool], true
        else
          out[j], holes = '', true  -- the caller fills it among the untouched items
        end
      end
    end
  end
  return out, holes
end

local K = buffer_keys(KEYS)
local draws = #ARGV[7] / tonumber(ARGV[8])
if ARGV[5] == 'correct' then draws = draws / (1 + tonumber(ARGV[9])) end
if draws > RB_MAX_ITEMS then
  return fail('RB_LIMIT', 'one command commits at most ' .. RB_MAX_ITEMS .. ' draws, got '
    .. draws .. ' (redisbuf/store/bounds.py)')
end
local conf = redis.call('HMGET', K.meta, 'tree', 'tree_mass', 'log_epoch', 'log_version',
  'log_stamp', 'per_sum', 'per_comp', 'per_nonzero', 'per_alpha', 'per_eps')
local per = conf[2] == 'per'
if conf[1] ~= '1' or (ARGV[1] == 'per' and not per) then
  if ARGV[1] == 'per' then return fail('RB_NOTREE', 'prioritized experience replay is not enabled') end
  return fail('RB_NOTREE', 'prioritized sampling is not enabled')
end
if ARGV[1] ~= 'per' and per then
  return fail('RB_CONFIG', 'buffer ' .. K.meta .. ' samples by PER priorities'
    .. ' (PERSampler), not by log-rewards')
end
local current = conf[3] == ARGV[2] and conf[4] == ARGV[3] and conf[5] == ARGV[4]
local entries, ids, primaries = {}, {}, {}
if ARGV[5] == 'correct' then
  local spares = tonumber(ARGV[9])
  local candidates = unpack_ids(ARGV[7], tonumber(ARGV[8]))
  local width = 1 + spares
  for j = 1, #candidates / width do primaries[j] = candidates[width * (j - 1) + 1] end
  if current then
    for j = 1, #candidates / width do ids[j] = candidates[width * (j - 1) + 1] end
  else
    local behind = masslog_behind(K, ARGV[2], tonumber(ARGV[3]), ARGV[4])
    if #behind == 4 or #behind - 4 ~= tonumber(behind[3]) - tonumber(ARGV[3]) then
      return behind  -- cannot catch up from the log, or too far behind for one reply
    end
    for i = 5, #behind do entries[#entries + 1] = behind[i] end
    local holes
    ids, holes = correct_draw(entries, per, tonumber(conf[9]) or 1, tonumber(conf[10]) or 0,
      tonumber(ARGV[12]), tonumber(ARGV[11]), candidates, spares, ARGV[10])
    if not ids then return behind end
    if holes then  -- nothing is recorded: the caller completes the draw and commits it
      local out = {3, conf[3] or '', conf[4] or '0', conf[5] or '', table.concat(ids, ',')}
      for i = 1, #entries do out[#out + 1] = entries[i] end
      return out
    end
  end
else
  if not current then
    return masslog_behind(K, ARGV[2], tonumber(ARGV[3]), ARGV[4])
  end
  ids = unpack_ids(ARGV[7], tonumber(ARGV[8]))
end
local sum = (tonumber(conf[6]) or 0) + (tonumber(conf[7]) or 0)
local corrected = ''
if #entries > 0 then corrected = table.concat(ids, ',') end
local out = {1, redis.call('ZCARD', K.order), fmt(sum), conf[8] or '0', corrected, conf[3] or '',
  conf[4] or '0', conf[5] or '', 0}
if ARGV[6] == '1' then
  local blobs = hmget_chunked(K.items, ids)
  for i = 1, #ids do out[#out + 1] = blobs[i] end
  out[9] = #ids
elseif #entries > 0 then  -- corrected: the blobs of the draws that moved, read here (atomic)
  local moved, where = {}, {}
  for j = 1, #ids do
    if ids[j] ~= primaries[j] then
      moved[#moved + 1] = ids[j]
      where[#where + 1] = j
    end
  end
  local blobs = hmget_chunked(K.items, moved)
  for j = 1, #ids do out[9 + j] = false end
  for k = 1, #moved do out[9 + where[k]] = blobs[k] end
  out[9] = #ids
end
for i = 1, #entries do out[#out + 1] = entries[i] end
record_draws(K, ids)  -- after reading the blobs: it may remove used-up items
return out
