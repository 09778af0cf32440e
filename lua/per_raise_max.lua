-- Raise a PER buffer's running max priority (meta per_max, what new items get without
-- priorities of their own) to at least ARGV[1]: a sharded buffer's shards share one
-- running max, the highest priority set on any of them (redisbuf/buffers/sharded.py).
-- @include common
-- @include masslog
-- @include items
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order
-- ARGV[1] the priority (text: a finite number >= 0)
-- Returns the running max after the call (text). Errors: RB_NOBUF, RB_CONFIG (no PER),
-- RB_INVALID (not a finite number >= 0).
local K = buffer_keys(KEYS)
local conf = redis.call('HMGET', K.meta, 'capacity', 'tree_mass')
if not conf[1] then return fail('RB_NOBUF', 'buffer meta ' .. K.meta .. ' does not exist') end
if conf[2] ~= 'per' then
  return fail('RB_CONFIG', 'buffer ' .. K.meta .. ' has no PER priorities (use PERSampler)')
end
local value = per_parse(ARGV[1])
if value == nil then
  return fail('RB_INVALID', 'priority ' .. tostring(ARGV[1]) .. ' must be finite and >= 0')
end
per_raise_max(K, value)
return redis.call('HGET', K.meta, 'per_max')
