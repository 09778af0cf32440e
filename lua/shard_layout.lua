-- Write a sharded buffer's layout once (the first process wins), then return it.
-- @keys 2
-- @retry never
-- KEYS[1] the layout hash (rb:{name}:shards)  KEYS[2] the meta key of a plain buffer of the
-- same name (rb:{name}:meta)
-- ARGV[1] the layout (JSON) to write when there is none, or "" only to read it
-- Returns the stored layout (JSON), or nil when there is none and ARGV[1] is "".
-- Errors: RB_UNSHARDED when a plain buffer has the name (nothing is written): checked here,
-- in the one script that creates the layout, as lua/init.lua refuses the reverse.
if redis.call('EXISTS', KEYS[2]) == 1 then
  return redis.error_reply('RB_UNSHARDED ' .. KEYS[2] .. ' holds an unsharded buffer of this name')
end
if ARGV[1] ~= '' then
  redis.call('HSETNX', KEYS[1], 'layout', ARGV[1])
end
return redis.call('HGET', KEYS[1], 'layout')
