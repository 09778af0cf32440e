-- Commit a prioritized draw made by a sampling process from its replica of the buffer's
-- scores (redisbuf/sampling/replica.py): check that the replica was current, record the draws and
-- optionally return the blobs, in one atomic call. The same script serves softmax of
-- log-rewards and PER: the replica applies the mass rule, the server only checks versions.
-- @include common
-- @include masslog
-- @include items
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order
-- ARGV[1] "softmax" or "per" (the rule the replica drew by)  ARGV[2] its log_epoch
-- ARGV[3] its log_version  ARGV[4] "exact": the draw stands only if no change was logged
-- since that version (the draw then follows every change made before this call);
-- "present": the draw stands if its items are all still present (for a replica brought up
-- to date after the sample began, by this script's previous reply or by reading the
-- buffer: the draw follows every change made before the sample began)
-- "correct" (PER, with replacement): as "exact" when nothing changed since; otherwise the
-- draw is corrected here to the current law (see correct_draw) and stands
-- ARGV[5] "1" = also return blobs  ARGV[6..] the drawn ids (12-digit; may repeat)
-- In "correct" mode instead: ARGV[6] the draws' candidate ids packed (12 characters each,
-- 1 + S per draw: the draw, then S more draws of the replica for its place)
-- ARGV[7] S  ARGV[8] two uniforms per draw, packed 6 bytes each (see uniform_at)
-- Returns {1, length, per_sum, per_nonzero, ids, epoch, version, count, blob_1..blob_count,
-- entry_1..} when the draw stands: ids "" when the draw stands as sent, else the
-- corrected draw packed (12 characters each), with the log entries after the replica's
-- version (its catch-up) after the blobs (count of them, 0 unless asked); per_sum /
-- per_nonzero: the mean non-zero PER priority. Else the replica's catch-up
-- (masslog_behind): {0, epoch, version, first, entries...}.
-- Errors: RB_NOTREE (prioritized sampling, or PER for "per", is not on), RB_CONFIG (the
-- buffer samples by the other rule).

-- The draw of a replica at an earlier version (packed candidates, see ARGV[6]) corrected to
-- the current PER law, given the log entries since that version: the items they name
-- ("touched": added, re-scored or removed) are the only ones whose mass changed. Each
-- draw independently: with probability (mass of the touched items present) / (total mass,
-- meta per_mass), an item among the touched ones in proportion to its mass (its first
-- uniform decides, its second picks); else its first candidate not touched: the
-- replica's draws were in proportion to masses that are still those of the untouched
-- items, so among them they follow the current law. Nil when a draw's candidates are all
-- touched, or the total is not kept (a buffer from an earlier version).
local function correct_draw(K, entries, packed, spares, uniforms)
  local conf = redis.call('HMGET', K.meta, 'per_mass', 'per_mass_comp', 'per_alpha', 'per_eps')
  if not conf[1] then return nil end
  local total = tonumber(conf[1]) + tonumber(conf[2])
  local alpha, eps = tonumber(conf[3]), tonumber(conf[4])
  local touched, list = {}, {}
  for _, entry in ipairs(entries) do
    local kind = string.sub(entry, 1, 1)
    if kind == 'X' then return nil end
    local bar = string.find(entry, '|', 3, true)
    local count = tonumber(string.sub(entry, 3, bar - 1))
    for i = 0, count - 1 do
      local id = string.sub(entry, bar + 1 + 12 * i, bar + 12 + 12 * i)
      if not touched[id] then
        touched[id] = true
        list[#list + 1] = id
      end
    end
  end
  local priorities = zmscore_chunked(K.per, list)
  local live, cumulative, changed = {}, {}, 0
  for i, id in ipairs(list) do
    if priorities[i] then
      local m = per_mass_of(tonumber(priorities[i]), alpha, eps)
      if m > 0 then
        changed = changed + m
        live[#live + 1] = id
        cumulative[#live] = changed
      end
    end
  end
  local share = 0
  if total > 0 then share = changed / total end
  local width = 12 * (spares + 1)
  local n = #packed / width
  local out = {}
  for j = 1, n do
    if #live > 0 and uniform_at(uniforms, 2 * j - 1) < share then
      local target = uniform_at(uniforms, 2 * j) * changed
      local lo, hi = 1, #live
      while lo < hi do  -- the first cumulative mass above the target
        local mid = math.floor((lo + hi) / 2)
        if cumulative[mid] > target then hi = mid else lo = mid + 1 end
      end
      out[j] = live[lo]
    else
      for k = 0, spares do
        local start = width * (j - 1) + 12 * k + 1
        local id = string.sub(packed, start, start + 11)
        if not touched[id] then
          out[j] = id
          break
        end
      end
      if not out[j] then return nil end
    end
  end
  return out
end

local K = buffer_keys(KEYS)
local conf = redis.call('HMGET', K.meta, 'tree', 'tree_mass', 'log_epoch', 'log_version',
  'per_sum', 'per_comp', 'per_nonzero', 'per_mass', 'per_mass_comp', 'per_alpha', 'per_eps')
local per = conf[2] == 'per'
if conf[1] ~= '1' or (ARGV[1] == 'per' and not per) then
  if ARGV[1] == 'per' then return fail('RB_NOTREE', 'prioritized experience replay is not enabled') end
  return fail('RB_NOTREE', 'prioritized sampling is not enabled')
end
if ARGV[1] ~= 'per' and per then
  return fail('RB_CONFIG', 'buffer ' .. K.meta .. ' samples by PER priorities'
    .. ' (PERSampler), not by log-rewards')
end
local have = tonumber(ARGV[3])
local entries, ids = {}, {}
if ARGV[4] == 'correct' then
  local packed, spares = ARGV[6], tonumber(ARGV[7])
  local width = 12 * (spares + 1)
  local n = #packed / width
  if conf[3] == ARGV[2] and conf[4] == ARGV[3] then
    for j = 1, n do ids[j] = string.sub(packed, width * (j - 1) + 1, width * (j - 1) + 12) end
  else
    local behind = masslog_behind(K, ARGV[2], have)
    if #behind == 4 and conf[4] ~= ARGV[3] then return behind end  -- no entries to go by
    for i = 5, #behind do entries[#entries + 1] = behind[i] end
    ids = correct_draw(K, entries, packed, spares, ARGV[8])
    if not ids then return behind end
  end
else
  if conf[3] ~= ARGV[2] or (ARGV[4] == 'exact' and conf[4] ~= ARGV[3]) then
    return masslog_behind(K, ARGV[2], have)
  end
  for i = 6, #ARGV do ids[#ids + 1] = ARGV[i] end
  if ARGV[4] ~= 'exact' then
    local present = zmscore_chunked(K.order, ids)
    for i = 1, #ids do
      if not present[i] then return masslog_behind(K, ARGV[2], have) end
    end
  end
end
local sum = (tonumber(conf[5]) or 0) + (tonumber(conf[6]) or 0)
local corrected = ''
if #entries > 0 then corrected = table.concat(ids) end
local out = {1, redis.call('ZCARD', K.order), fmt(sum), conf[7] or '0', corrected, conf[3] or '',
  conf[4] or '0', 0}
if ARGV[5] == '1' then
  local blobs = hmget_chunked(K.items, ids)
  for i = 1, #ids do out[#out + 1] = blobs[i] end
  out[8] = #ids
end
for i = 1, #entries do out[#out + 1] = entries[i] end
record_draws(K, ids)  -- after reading the blobs: it may remove used-up items
return out
