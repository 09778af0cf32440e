-- Remove every item; keep configuration and schema; reset counters. Ids keep growing.
-- KEYS[1] meta  KEYS[2..] the data keys (items, prio, order, tree, tree:ids, tree:slots,
-- tree:free)
-- Returns the number of items removed. Errors: RB_NOBUF (the buffer was dropped: writing
-- counters would leave a meta hash without a configuration).
if not redis.call('HGET', KEYS[1], 'capacity') then
  return redis.error_reply('RB_NOBUF buffer meta ' .. KEYS[1] .. ' does not exist')
end
local removed = redis.call('ZCARD', KEYS[4])
for i = 2, #KEYS do redis.call('DEL', KEYS[i]) end
redis.call('HSET', KEYS[1], 'inserted', 0, 'evicted', 0, 'sampled', 0, 'tree_next_slot', 0)
-- data-lifetime counters (lua/_items.lua); the current version and session stay
redis.call('HDEL', KEYS[1], 'present_uses', 'removed_uses', 'removed_items', 'retired',
  'stale_removed', 'rejected_stale', 'rejected_session', 'staleness_sum', 'staleness_count',
  'rl_inserts', 'rl_samples')  -- and the rate limiter's (lua/rate_limit.lua)
redis.call('HDEL', KEYS[1], 'tree_ref', 'per_sum', 'per_comp', 'per_nonzero')
return removed
