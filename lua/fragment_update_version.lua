-- Set the current model version and session, then drop every chunk that is now too
-- stale (version < current - max_staleness) or, when the session changed, every chunk
-- (all stored chunks belong to the session current when they arrived).
-- @include common
-- @include fragments
-- @keys 9
-- @retry never
-- KEYS[1] meta  KEYS[2..9] frags, finfo, refs, pending, streams, chunks, cinfo, cversions
-- ARGV[1] session id  ARGV[2] model version (integer)
-- Returns the number of chunks dropped. Errors: RB_NOBUF (meta missing).
local F = fragment_keys(KEYS)
local old_session = redis.call('HGET', F.meta, 'session')
if not old_session then return fail('RB_NOBUF', 'fragment buffer meta ' .. F.meta .. ' does not exist') end
redis.call('HSET', F.meta, 'session', ARGV[1], 'version', ARGV[2])
return drop_stale_chunks(F, old_session ~= ARGV[1])
