-- Turn on prioritized experience replay (PER): PER priorities in the per zset and a sum
-- tree whose leaf masses are (priority + eps)^alpha. add.lua, update_priority.lua and the
-- removers keep both up to date from then on, whichever process writes.
-- @include common
-- @include tree
-- @include items
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order
-- ARGV[1] alpha  ARGV[2] eps  ARGV[3] initial_priority  (numbers as text)
-- Items present without a PER priority get initial_priority. Alpha, eps and
-- initial_priority are the buffer's from then on: every process must ask for the same.
-- Returns 1 if turned on now, 0 if it was on with these settings.
-- Errors: RB_NOBUF, RB_CONFIG (other settings, or a softmax tree is in use).
local K = buffer_keys(KEYS)
local conf = redis.call('HMGET', K.meta, 'capacity', 'tree', 'tree_mass', 'per_alpha', 'per_eps',
  'per_initial')
if not conf[1] then return fail('RB_NOBUF', 'buffer meta ' .. K.meta .. ' does not exist') end
local alpha, eps, initial = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if conf[3] == 'per' then
  if tonumber(conf[4]) ~= alpha or tonumber(conf[5]) ~= eps or tonumber(conf[6]) ~= initial then
    return fail('RB_CONFIG', 'buffer ' .. K.meta .. ' uses PER with alpha=' .. conf[4]
      .. ', eps=' .. conf[5] .. ', initial_priority=' .. conf[6] .. ', not alpha=' .. ARGV[1]
      .. ', eps=' .. ARGV[2] .. ', initial_priority=' .. ARGV[3] .. ' (PER settings mismatch)')
  end
  if redis.call('HGET', K.meta, 'tree_layout') ~= TREE_LAYOUT then  -- an earlier version's tree
    tree_rebuild(K.meta, K.per, K.tree, K.tree_ids, K.tree_slots, K.tree_free, tonumber(conf[1]))
  end
  return 0
end
if conf[2] == '1' then
  return fail('RB_CONFIG', 'buffer ' .. K.meta .. ' samples by softmax of log-rewards'
    .. ' (prioritized_sampling): its sum tree cannot also hold PER priorities')
end
redis.call('HSET', K.meta, 'per_alpha', ARGV[1], 'per_eps', ARGV[2], 'per_initial', ARGV[3],
  'tree_mass', 'per')
local present = redis.call('ZRANGE', K.order, 0, -1)
local missing = {}
for _, id in ipairs(present) do
  if not redis.call('ZSCORE', K.per, id) then
    missing[#missing + 1] = fmt(initial)
    missing[#missing + 1] = id
  end
end
call_chunked('ZADD', K.per, missing)
redis.call('HDEL', K.meta, 'per_sum', 'per_comp', 'per_nonzero')
local scores = redis.call('ZRANGE', K.per, 0, -1, 'WITHSCORES')
local values = {}
for i = 2, #scores, 2 do values[#values + 1] = tonumber(scores[i]) end
per_account(K, {}, values)
tree_rebuild(K.meta, K.per, K.tree, K.tree_ids, K.tree_slots, K.tree_free, tonumber(conf[1]))
return 1
