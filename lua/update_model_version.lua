-- Make a model version and session current and remove the items that no longer fit
-- (MineStudio's update_model_version, DI-engine's staleness).
-- @include common
-- @include masslog
-- @include items
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order (see
-- buffer_keys in _common.lua)
-- ARGV[1] session id  ARGV[2] model version (integer)
-- A session other than the current one removes every item (all of them belong to the
-- current session, see admit_batch), in O(1) commands; then, with max_staleness, items whose version is
-- below version - max_staleness are removed. Items added without a version never go stale.
-- Returns the number of items removed (counted in meta stale_removed). Errors: RB_NOBUF.
local K = buffer_keys(KEYS)
local conf = redis.call('HMGET', K.meta, 'capacity', 'cur_session', 'max_staleness')
if not conf[1] then
  return fail('RB_NOBUF', 'buffer meta ' .. K.meta .. ' does not exist')
end
local removed = 0
if conf[2] and conf[2] ~= ARGV[1] then
  -- every item goes: unlink the item structures (freed in the background) and move the
  -- counters in O(1), rather than delete item by item, so a switch over millions of
  -- items is no long command; samplers' replicas read the (empty) buffer again
  removed = redis.call('ZCARD', K.order)
  for _, key in ipairs({K.items, K.prio, K.order, K.per, K.per_heap, K.uses, K.versions,
                        K.times, K.vecs}) do
    redis.call('UNLINK', key)
  end
  local uses = tonumber(redis.call('HGET', K.meta, 'present_uses')) or 0
  redis.call('HINCRBY', K.meta, 'removed_items', removed)
  if uses > 0 then redis.call('HINCRBY', K.meta, 'removed_uses', uses) end
  redis.call('HDEL', K.meta, 'present_uses', 'per_sum', 'per_comp', 'per_nonzero')
  if masslog_on(K) then masslog_reset(K) end
  notify_changed(K.meta)
end
redis.call('HSET', K.meta, 'cur_session', ARGV[1], 'cur_version', ARGV[2])
if conf[3] then
  local limit = tonumber(ARGV[2]) - tonumber(conf[3])
  local ids = redis.call('ZRANGEBYSCORE', K.versions, '-inf', '(' .. fmt(limit))
  remove_items(K, ids)
  removed = removed + #ids
end
if removed > 0 then redis.call('HINCRBY', K.meta, 'stale_removed', removed) end
return removed
