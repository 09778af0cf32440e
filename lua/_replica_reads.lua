-- What a sampling process's replica of a mass log reads (redisbuf/sampling/replica.py), a
-- helper scripts name with "-- @include replica_reads": the same arguments and replies
-- for a replay buffer's scores and a sequence buffer's step priorities, whose operation
-- scripts only map their KEYS (lua/masslog_read.lua, lua/seq_masslog_read.lua). A first
-- read without a snapshot reads with native commands (lua/replica_read.lua,
-- lua/seq_replica_read.lua).
-- @include common
-- @include masslog

-- The catch-up read: the log entries after the replica's version, at most one reply's
-- worth (masslog_behind), after the pin request of argv[4] (see lua/masslog_read.lua for
-- the ARGV). Returns {0, epoch, version, stamp, entries...}, or {2} when the log is off.
local function masslog_read(K, argv)
  if not masslog_on(K) then return {2} end
  local holder = argv[4] == 'unpin' and argv[5] or argv[6]
  local bad = bad_holder(holder)
  if bad then return bad end
  if argv[4] == 'pin' then
    masslog_pin(K, tonumber(redis.call('HGET', K.meta, 'log_version')) or 0, tonumber(argv[5]),
      holder)
  elseif argv[4] == 'pin_at' then  -- keep the entries after the replica's own version
    masslog_pin(K, tonumber(argv[2]), tonumber(argv[5]), holder)
  elseif argv[4] == 'unpin' then
    masslog_unpin(K, holder)
  end
  return masslog_behind(K, argv[1], tonumber(argv[2]), argv[3])
end
