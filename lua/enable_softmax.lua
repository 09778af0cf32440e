-- Turn on prioritized sampling by softmax of log-rewards: from now on every change to the
-- prio zset is appended to the mass log (lua/_masslog.lua), whichever process writes, and
-- samplers draw from replicas of it (redisbuf/sampling/replica.py). O(1): a replica reads the prio
-- zset itself.
-- @include common
-- @include masslog
-- @keys 13
-- @retry safe
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order
-- ARGV[1] "1" = start a new log even if it is on (every replica reads everything again)
-- Returns 1 if turned on (or restarted) now, 0 if it was on.
-- Errors: RB_NOBUF, RB_CONFIG (the buffer uses PER).
local K = buffer_keys(KEYS)
local conf = redis.call('HMGET', K.meta, 'masslog', 'capacity', 'mass', 'log_epoch')
if not conf[2] then return fail('RB_NOBUF', 'buffer meta ' .. K.meta .. ' does not exist') end
if conf[3] == 'per' then
  return fail('RB_CONFIG', 'buffer ' .. K.meta .. ' uses prioritized experience replay (PERSampler):'
    .. ' its priorities are PER priorities, not log-rewards')
end
if conf[1] == '1' and conf[4] and ARGV[1] ~= '1' then return 0 end
redis.call('HSET', K.meta, 'masslog', '1')
masslog_reset(K)
return 1
