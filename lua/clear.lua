-- Remove every item; keep configuration and schema; reset counters. Ids keep growing.
-- @include common
-- @include masslog
-- @keys 13
-- @retry never
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order
-- With prioritized sampling on, the mass log starts a new epoch (replicas read again).
-- Returns the number of items removed. Errors: RB_NOBUF (the buffer was dropped: writing
-- counters would leave a meta hash without a configuration).
local K = buffer_keys(KEYS)
if not redis.call('HGET', K.meta, 'capacity') then
  return redis.error_reply('RB_NOBUF buffer meta ' .. K.meta .. ' does not exist')
end
local removed = redis.call('ZCARD', K.order)
-- UNLINK: large hashes and sorted sets are freed in the background, so clearing a
-- buffer of millions of items is no long command
for i = 2, #KEYS do redis.call('UNLINK', KEYS[i]) end
redis.call('HSET', K.meta, 'inserted', 0, 'evicted', 0, 'sampled', 0,
  'reset_through', redis.call('HGET', K.meta, 'last_id') or 0)
-- data-lifetime counters (lua/_items.lua); the current version and session stay
redis.call('HDEL', K.meta, 'present_uses', 'removed_uses', 'removed_items', 'retired',
  'stale_removed', 'rejected_stale', 'rejected_session', 'staleness_sum', 'staleness_count',
  'rl_inserts', 'rl_samples',  -- and the rate limiter's (lua/rate_limit.lua)
  'sampled_unique', 'deleted')  -- items ever sampled, removed by id (lua/remove.lua)
redis.call('HDEL', K.meta, 'per_sum', 'per_comp', 'per_nonzero', 'per_max')
if masslog_on(K) then masslog_reset(K) end
-- PER: the new epoch's base has no item (any priority will do for none)
local initial = redis.call('HGET', K.meta, 'per_initial')
if initial and redis.call('HGET', K.meta, 'mass') == 'per' then
  redis.call('HSET', K.meta, 'per_base', initial)
end
return removed
