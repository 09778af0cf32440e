-- What a prioritized sampler's replica (redisbuf/sampling/replica.py) needs to catch up: the log
-- entries after its version. Read-only.
-- @include common
-- @include masslog
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order
-- ARGV[1] the replica's log_epoch ("" for none)  ARGV[2] its log_version
-- Returns {0, epoch, version, first, entries after ARGV[2]...} (no entries when the
-- replica is of another epoch or further behind than the log holds: it reads everything
-- again), or {2} when prioritized sampling is off.
local K = buffer_keys(KEYS)
if not masslog_on(K) then return {2} end
return masslog_behind(K, ARGV[1], tonumber(ARGV[2]))
