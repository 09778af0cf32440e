-- Draw items for prioritized experience replay, with replacement: item i with probability
-- (p_i + eps)^alpha / sum_j (p_j + eps)^alpha.
-- @include common
-- @include tree
-- @include items
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order
-- ARGV[1] n  ARGV[2] "1" = also return blobs
-- ARGV[3] n uniforms in [0, 1), packed 6 bytes each (see uniform_at)
-- O(log capacity) per draw (tree_walk). Returns {total, min_mass, length, sum, nonzero,
-- id_1..id_n, mass_1..mass_n, priority_1..priority_n} and, if asked, {blob_1..blob_n}
-- after them: mass_i / total is draw i's probability, min_mass the mass of the lowest
-- priority with a non-zero mass, sum / nonzero the mean non-zero priority.
-- Errors: RB_NOTREE (PER is not on, or its tree has an earlier layout), RB_EMPTY,
-- RB_INVALID.
local K = buffer_keys(KEYS)
local conf = redis.call('HMGET', K.meta, 'tree', 'tree_depth', 'tree_mass', 'per_eps',
  'per_sum', 'per_comp', 'per_nonzero')
if conf[1] ~= '1' or conf[3] ~= 'per' then
  return fail('RB_NOTREE', 'prioritized experience replay is not enabled')
end
local layout_err = tree_layout_error(K.meta)
if layout_err then return layout_err end
local n = tonumber(ARGV[1])
if #ARGV[3] ~= 6 * n then return fail('RB_INVALID', 'expected ' .. n .. ' packed uniforms') end
local root = redis.call('HGET', K.tree, 0)
local total = root and chunk_sum(root) or 0
if total <= 0 then
  return fail('RB_EMPTY', 'buffer is empty (no item with a non-zero PER mass)')
end
local slots, masses = tree_walk(K.tree, tonumber(conf[2]), ARGV[3], n, total)
local ids = tree_ids_of(K.tree_ids, slots)
local lowest
if tonumber(conf[4]) > 0 then
  lowest = redis.call('ZRANGE', K.per, 0, 0, 'WITHSCORES')
else
  lowest = redis.call('ZRANGEBYSCORE', K.per, '(0', '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
end
local min_mass = tree_leaf_mass(K.meta, tonumber(lowest[2]))
local priorities = per_scores(K, ids)
local sum = (tonumber(conf[5]) or 0) + (tonumber(conf[6]) or 0)
local out = {fmt(total), fmt(min_mass), redis.call('ZCARD', K.order), fmt(sum), conf[7] or '0'}
for i = 1, n do out[5 + i] = ids[i] end
for i = 1, n do out[5 + n + i] = fmt(masses[i]) end
for i = 1, n do out[5 + 2 * n + i] = fmt(priorities[i] or 0) end
if ARGV[2] == '1' then
  local blobs = hmget_chunked(K.items, ids)
  for i = 1, n do out[5 + 3 * n + i] = blobs[i] end
end
record_draws(K, ids)  -- after reading the blobs: it may remove used-up items
return out
