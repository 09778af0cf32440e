-- How a replica's first read of a prioritized SequenceBuffer's step priorities goes
-- (MassReplica.load through SequenceBuffer's priority source), when it has no snapshot to
-- read: lua/replica_read.lua's counterpart for the sequence buffer's keys. The replica
-- then reads the prio hash (slot -> priority) itself with native HSCAN steps of bounded
-- cost. Keeps the log's entries after the pinned version for the next ARGV[1]
-- milliseconds (masslog_pin), which the replica applies afterwards; the replica calls
-- this again to renew the pin while it reads.
-- @include common
-- @include masslog
-- @include seq
-- @keys 10
-- @retry never
-- KEYS[1] meta  KEYS[2..10] steps, envs, episodes, begins, rewards, returns, prio,
-- masslog, snap
-- ARGV[1] pin milliseconds  ARGV[2] the version pinned (the log_version read before)
-- ARGV[3] optional: the reader's token (letters and digits; the version when absent):
--   its pin replaces its earlier one, other readers' pins stay (masslog_pin)
-- Returns {'hash', the prio hash's key}: HSCAN it (field: the slot, value: its priority).
-- A slot may come twice, and one changed meanwhile may come with either priority: the
-- entries after the pinned version set it right. Read-only but for the pin.
-- Errors: RB_NOLOG (the buffer is not prioritized),
--   RB_INVALID (a pin holder not of letters and digits).
local K = seq_keys(KEYS)
if not masslog_on(K) then
  return fail('RB_NOLOG', 'sequence buffer ' .. K.meta .. ' is not prioritized')
end
local bad = bad_holder(ARGV[3])
if bad then return bad end
masslog_pin(K, tonumber(ARGV[2]), tonumber(ARGV[1]), ARGV[3])
return {'hash', K.prio}
