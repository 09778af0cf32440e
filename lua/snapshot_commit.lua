-- Publish a replica's snapshot of the scores (redisbuf/sampling/replica.py, write_snapshot):
-- the staged hash becomes the buffer's snapshot, which a new replica reads in a few large
-- replies instead of scanning every item, then follows the log from the snapshot's version.
-- @include common
-- @keys 3..4
-- @retry never
-- KEYS[1] meta  KEYS[2] the staged snapshot (its fields written by HSET)
-- KEYS[3] the snapshot (rb:{name}:snap)  KEYS[4] optional: the per hash of the earlier
--   layout (meta per_legacy: the epoch's base), unlinked once a snapshot of the epoch holds
--   what it held
-- ARGV[1] the snapshot's header (JSON: epoch, version, stamp, rule, count, chunks...)
-- ARGV[2] its epoch  ARGV[3] its version (a version of that epoch the log reached)
-- The staged hash replaces the snapshot only if its epoch is the log's and it is newer
-- than the snapshot there (else it is deleted). O(1) but for freeing the old snapshot (a
-- few dozen fields). Returns 1 when published, 0 when not.
refuse_while_applying(KEYS[1])  -- a replica's scores of part of a large add: not published
local epoch = redis.call('HGET', KEYS[1], 'log_epoch')
local version = tonumber(ARGV[3])
local current = redis.call('HMGET', KEYS[1], 'log_version', 'snap_epoch', 'snap_version')
if epoch ~= ARGV[2] or version > (tonumber(current[1]) or 0)
    or (current[2] == epoch and (tonumber(current[3]) or 0) >= version) then
  redis.call('UNLINK', KEYS[2])
  return 0
end
redis.call('HSET', KEYS[2], 'header', ARGV[1])
redis.call('RENAME', KEYS[2], KEYS[3])
redis.call('PERSIST', KEYS[3])  -- the staged hash expires if its writer dies halfway
redis.call('HSET', KEYS[1], 'snap_epoch', epoch, 'snap_version', version)
if KEYS[4] and redis.call('HGET', KEYS[1], 'per_legacy') == '1' then
  redis.call('UNLINK', KEYS[4])
  redis.call('HDEL', KEYS[1], 'per_legacy')
end
return 1
