-- Fix a buffer's data-lifetime settings (redisbuf/sampling/lifetime.py) when it is created.
-- @keys 1
-- @retry safe
-- KEYS[1] meta
-- ARGV[1] max_use  ARGV[2] max_staleness  ("" = not given)
-- A given setting is stored when the buffer has none yet and has never held an item
-- (last_id 0), so every process that samples applies the same rule from the first item.
-- Returns {max_use, max_staleness} as stored ("" = none). Errors: RB_NOBUF.
local meta = KEYS[1]
local conf = redis.call('HMGET', meta, 'capacity', 'last_id', 'max_use', 'max_staleness')
if not conf[1] then
  return redis.error_reply('RB_NOBUF buffer meta ' .. meta .. ' does not exist')
end
local fresh = tonumber(conf[2]) == 0
local names = {'max_use', 'max_staleness'}
local out = {}
for i = 1, 2 do
  local stored = conf[2 + i]
  if not stored and ARGV[i] ~= '' and fresh then
    redis.call('HSET', meta, names[i], ARGV[i])
    stored = ARGV[i]
  end
  out[i] = stored or ''
end
return out
