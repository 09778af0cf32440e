-- Create an episode buffer's meta hash if it does not exist, then return it.
-- @keys 1
-- @retry never
-- KEYS[1] meta (see redisbuf/buffers/episodes.py for every key of an episode buffer)
-- ARGV[1] capacity in episodes  ARGV[2] format version  ARGV[3] creation time (unix s)
-- Returns: HGETALL of meta (field, value, ...). The caller compares it with what it asked.
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1],
    'kind', 'episodes', 'capacity', ARGV[1], 'format_version', ARGV[2],
    'created_at', ARGV[3], 'last_id', 0, 'next_pos', 0, 'steps', 0,
    'pushed', 0, 'evicted', 0, 'sampled', 0)
end
return redis.call('HGETALL', KEYS[1])
