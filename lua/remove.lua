-- Remove chosen items (DI-engine's delete, a facade's removal by id): each id still
-- stored leaves every per-item structure as an eviction removes it (remove_items: order,
-- log-rewards, PER priorities, uses, versions, and a mass-log entry so that samplers'
-- replicas stop drawing it). Ids not stored (never, or removed already) are skipped.
-- @include common
-- @include masslog
-- @include items
-- @keys 13
-- @retry never
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order (see
-- buffer_keys in _common.lua)
-- ARGV[1..] the ids to remove (stored form, 12 digits); an id may repeat
-- At most RB_MAX_ADD ids per call (removing an item costs what storing one does:
-- redisbuf/store/bounds.py). Counted in meta removed_items, as every removal. Returns the
-- number of items removed. Errors: RB_NOBUF, RB_LIMIT.
local K = buffer_keys(KEYS)
if #ARGV > RB_MAX_ADD then
  return fail('RB_LIMIT', 'one call removes at most ' .. RB_MAX_ADD .. ' items, got ' .. #ARGV)
end
if not redis.call('HGET', K.meta, 'capacity') then
  return fail('RB_NOBUF', 'buffer meta ' .. K.meta .. ' does not exist')
end
local stored, seen = {}, {}
for i = 1, #ARGV do
  local id = ARGV[i]
  if not seen[id] and redis.call('HEXISTS', K.items, id) == 1 then
    stored[#stored + 1] = id
  end
  seen[id] = true
end
remove_items(K, stored)
if #stored > 0 then notify_changed(K.meta) end
return #stored
