-- Remove every episode; keep the configuration and schema. Ids and positions keep growing.
-- @keys 4
-- @retry never
-- KEYS[1] meta  KEYS[2] index  KEYS[3] lens  KEYS[4] steps
-- Returns the number of episodes removed. Errors: RB_NOBUF (the buffer was dropped).
if not redis.call('HGET', KEYS[1], 'capacity') then
  return redis.error_reply('RB_NOBUF episode buffer meta ' .. KEYS[1] .. ' does not exist')
end
local removed = redis.call('ZCARD', KEYS[2])
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
redis.call('HSET', KEYS[1], 'steps', 0)
return removed
