-- What a replica of a prioritized SequenceBuffer's step priorities (redisbuf/sampling/
-- replica.py, through SequenceBuffer's priority source) needs to catch up: the log entries
-- after its version, at most one reply's worth (masslog_behind); it asks again from where
-- they end. lua/masslog_read.lua's counterpart for the sequence buffer's keys.
-- @include common
-- @include masslog
-- @include seq
-- @keys 10
-- @retry never
-- KEYS[1] meta  KEYS[2..10] steps, envs, episodes, begins, rewards, returns, prio,
-- masslog, snap
-- ARGV[1] the replica's log_epoch ("" for none)  ARGV[2] its log_version
-- ARGV[3] its log_stamp (of the entry at its version)
-- ARGV[4] optional: "pin" = a replica about to read every priority: keep the entries
--   after the current version for ARGV[5] milliseconds (masslog_pin); "pin_at" = the same
--   for the entries after ARGV[2] (a replica about to read a snapshot of that version);
--   "unpin" = that read is done: drop the pin if it is still at version ARGV[5]
-- Returns {0, epoch, version, stamp, entries after ARGV[2]...} (none when the replica is
-- of another epoch or history, or further behind than the log holds: it reads everything
-- again), or {2} when the buffer is not prioritized.
local K = seq_keys(KEYS)
if not masslog_on(K) then return {2} end
if ARGV[4] == 'pin' then
  masslog_pin(K, tonumber(redis.call('HGET', K.meta, 'log_version')) or 0, tonumber(ARGV[5]))
elseif ARGV[4] == 'pin_at' then  -- keep the entries after the replica's own version
  masslog_pin(K, tonumber(ARGV[2]), tonumber(ARGV[5]))
end
if ARGV[4] == 'unpin' and not RB_NO_WRITES
    and redis.call('HGET', K.meta, 'log_pin') == tostring(ARGV[5]) then
  redis.call('HDEL', K.meta, 'log_pin', 'log_pin_until')
end
return masslog_behind(K, ARGV[1], tonumber(ARGV[2]), ARGV[3])
