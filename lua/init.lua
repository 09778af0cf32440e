-- Create a buffer's meta hash if it does not exist, then return it.
-- KEYS[1] meta
-- ARGV[1] capacity        ARGV[2] eviction policy ("fifo" | "reward")
-- ARGV[3] format version  ARGV[4] creation time (unix seconds)
-- Returns: HGETALL of meta (field, value, ...). The caller compares it with what it asked.
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1],
    'capacity', ARGV[1], 'eviction', ARGV[2], 'format_version', ARGV[3],
    'created_at', ARGV[4], 'last_id', 0, 'inserted', 0, 'evicted', 0, 'sampled', 0,
    'tree', 0)
end
return redis.call('HGETALL', KEYS[1])
