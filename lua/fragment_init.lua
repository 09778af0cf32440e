-- Create a fragment buffer's meta hash if it does not exist, then return it.
-- @keys 1
-- @retry never
-- KEYS[1] meta (see redisbuf/buffers/fragments.py for every key of a fragment buffer)
-- ARGV[1] max_chunks  ARGV[2] fragments_per_chunk  ARGV[3] max_staleness  ARGV[4] max_reuse
-- ARGV[5] format version  ARGV[6] creation time (unix seconds)
-- The current model version starts at -1 and the session at "", as in MineStudio.
-- Returns: HGETALL of meta (field, value, ...). The caller compares it with what it asked.
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1],
    'kind', 'fragments', 'max_chunks', ARGV[1], 'fragments_per_chunk', ARGV[2],
    'max_staleness', ARGV[3], 'max_reuse', ARGV[4], 'format_version', ARGV[5],
    'created_at', ARGV[6], 'version', -1, 'session', '', 'last_fragment', 0,
    'last_chunk', 0, 'fragments_added', 0, 'fragments_discarded', 0, 'chunks_added', 0,
    'chunks_evicted', 0, 'chunks_discarded', 0, 'chunks_used_up', 0, 'fetched', 0,
    'reuse_sum', 0, 'reuse_weight', 0, 'staleness_sum', 0, 'staleness_weight', 0)
end
return redis.call('HGETALL', KEYS[1])
