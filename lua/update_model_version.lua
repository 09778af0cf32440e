-- Make a model version and session current and remove the items that no longer fit
-- (MineStudio's update_model_version, DI-engine's staleness).
-- @include common
-- @include masslog
-- @include items
-- @keys 13
-- @retry never
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order (see
-- buffer_keys in _common.lua)
-- ARGV[1] session id  ARGV[2] model version (integer)  ARGV[3] "" or "more" (below)
-- A session other than the current one removes every item (all of them belong to the
-- current session, see admit_batch), in O(1) commands; then, with max_staleness, items whose version is
-- below version - max_staleness are removed, the lowest versions first, at most RB_MAX_ADD
-- of them per call (removing an item costs what storing one does; redisbuf/store/bounds.py):
-- the caller calls again with ARGV[3] = "more" while some are left. Items added without a
-- version never go stale.
-- ARGV[3] "more": only remove the items stale under the current version (what another
-- process may have made current since), up to RB_MAX_ADD; ARGV[1..2] are not used.
-- Returns {removed, left}: the number of items removed by this call (counted in meta
-- stale_removed) and 1 when stale items are left, else 0. Errors: RB_NOBUF.
local K = buffer_keys(KEYS)
local conf = redis.call('HMGET', K.meta, 'capacity', 'cur_session', 'max_staleness',
  'cur_version')
if not conf[1] then
  return fail('RB_NOBUF', 'buffer meta ' .. K.meta .. ' does not exist')
end
local removed, left = 0, 0
local more = ARGV[3] == 'more'
local version = tonumber(ARGV[2])
if more then version = tonumber(conf[4]) end
if version == nil then return {0, 0} end
if not more and conf[2] and conf[2] ~= ARGV[1] then
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
  local initial = redis.call('HGET', K.meta, 'per_initial')  -- PER: a base of no item
  if initial and redis.call('HGET', K.meta, 'mass') == 'per' then
    redis.call('HSET', K.meta, 'per_base', initial)
  end
  notify_changed(K.meta)
end
if not more then
  redis.call('HSET', K.meta, 'cur_session', ARGV[1], 'cur_version', ARGV[2])
end
if conf[3] then
  local limit = version - tonumber(conf[3])
  local ids = redis.call('ZRANGEBYSCORE', K.versions, '-inf', '(' .. fmt(limit), 'LIMIT', 0,
    RB_MAX_ADD + 1)
  if #ids > RB_MAX_ADD then
    ids[#ids] = nil
    left = 1
  end
  remove_items(K, ids)
  removed = removed + #ids
end
if removed > 0 then redis.call('HINCRBY', K.meta, 'stale_removed', removed) end
return {removed, left}
