-- One slice of a replica's first read of a prioritized SequenceBuffer's step priorities
-- (MassReplica.load through SequenceBuffer's priority source): a SCAN step over the prio
-- hash (slot -> priority), packed into two texts (packed_scan, lua/_replica_reads.lua).
-- lua/replica_read.lua's counterpart for the sequence buffer's keys; it keeps the log's
-- entries after the pinned version for the next ARGV[3] milliseconds (masslog_pin), which
-- the replica applies afterwards.
-- @include replica_reads
-- @include seq
-- @keys 10
-- @retry never
-- KEYS[1] meta  KEYS[2..10] steps, envs, episodes, begins, rewards, returns, prio,
-- masslog, snap
-- ARGV[1] the SCAN cursor ("0" to start)  ARGV[2] COUNT  ARGV[3] pin milliseconds
-- ARGV[4] the version pinned (the log_version read before the first slice)
-- Returns {next cursor, slots (comma-separated), priorities (comma-separated)}; the read
-- is done when the cursor is "0". A slot may come twice, and one changed meanwhile may
-- come with either priority: the entries after the pinned version set it right.
-- Read-only but for the pin. Errors: RB_NOLOG (the buffer is not prioritized).
local K = seq_keys(KEYS)
if not masslog_on(K) then
  return fail('RB_NOLOG', 'sequence buffer ' .. K.meta .. ' is not prioritized')
end
masslog_pin(K, tonumber(ARGV[4]), tonumber(ARGV[3]))
return packed_scan(redis.call('HSCAN', K.prio, ARGV[1], 'COUNT', ARGV[2]))
