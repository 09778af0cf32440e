-- Turn on prioritized experience replay (PER): PER priorities in the per zset, and from
-- now on every change to them appended to the mass log (lua/_masslog.lua) by add.lua,
-- update_priority.lua and the removers, whichever process writes; PERSampler draws from a
-- replica of them, with masses (priority + eps)^alpha (redisbuf/replica.py).
-- @include common
-- @include masslog
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
  if conf[2] ~= '1' or not redis.call('HGET', K.meta, 'log_epoch') then  -- an earlier version's
    redis.call('HSET', K.meta, 'tree', '1')
    masslog_reset(K)
  end
  return 0
end
if conf[2] == '1' then
  return fail('RB_CONFIG', 'buffer ' .. K.meta .. ' samples by softmax of log-rewards'
    .. ' (prioritized_sampling): it cannot also sample by PER priorities')
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
redis.call('HSET', K.meta, 'tree', '1')
masslog_reset(K)
return 1
