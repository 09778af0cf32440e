-- Create a buffer's meta hash if it does not exist, then return it.
-- @keys 2
-- @retry safe
-- KEYS[1] meta  KEYS[2] the layout key of a sharded buffer of the same name (rb:{name}:shards)
-- ARGV[1] capacity        ARGV[2] eviction policy ("fifo" | "reward")
-- ARGV[3] format version  ARGV[4] creation time (unix seconds)
-- ARGV[5] retry window (seconds a batch id is remembered, see redisbuf/store/scripts.py)
-- Returns: HGETALL of meta (field, value, ...). The caller compares it with what it asked.
-- Errors: RB_SHARDED when the name is a sharded buffer's (nothing is written): checked
-- here, in the script that creates meta, so that no process can put a plain buffer beside
-- a shard layout (lua/shard_layout.lua refuses the reverse).
if redis.call('EXISTS', KEYS[2]) == 1 then
  return redis.error_reply('RB_SHARDED ' .. KEYS[2] .. ' holds a sharded buffer of this name')
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1],
    'capacity', ARGV[1], 'eviction', ARGV[2], 'format_version', ARGV[3],
    'created_at', ARGV[4], 'last_id', 0, 'inserted', 0, 'evicted', 0, 'sampled', 0,
    'masslog', 0, 'retry_window', ARGV[5])
end
return redis.call('HGETALL', KEYS[1])
