-- Make a model version and session current and remove the items that no longer fit
-- (MineStudio's update_model_version, DI-engine's staleness).
-- @include common
-- @include masslog
-- @include items
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order (see
-- buffer_keys in _common.lua)
-- ARGV[1] session id  ARGV[2] model version (integer)
-- A session other than the current one removes every item (all of them belong to the
-- current session, see admit_batch); then, with max_staleness, items whose version is
-- below version - max_staleness are removed. Items added without a version never go stale.
-- Returns the number of items removed (counted in meta stale_removed). Errors: RB_NOBUF.
local K = buffer_keys(KEYS)
local conf = redis.call('HMGET', K.meta, 'capacity', 'cur_session', 'max_staleness')
if not conf[1] then
  return fail('RB_NOBUF', 'buffer meta ' .. K.meta .. ' does not exist')
end
local removed = 0
if conf[2] and conf[2] ~= ARGV[1] then
  local ids = redis.call('ZRANGE', K.order, 0, -1)
  remove_items(K, ids)
  removed = #ids
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
