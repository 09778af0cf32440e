-- Remove items by id (Reverb's mutate_priorities deletes): every per-item structure, as
-- an eviction removes them, logged for prioritized samplers' replicas.
-- @include common
-- @include masslog
-- @include items
-- @keys 13
-- @retry safe
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order
-- ARGV[1] the ids packed (pack_ids in redisbuf/store/keys.py)  ARGV[2] their width
-- Ids not stored (never, or removed already) are skipped; an id named twice is removed
-- once. Counts the removed items in meta deleted. Returns how many were removed.
-- Errors: RB_NOBUF, RB_LIMIT (more than RB_MAX_ITEMS ids).
local K = buffer_keys(KEYS)
if not redis.call('HGET', K.meta, 'capacity') then
  return fail('RB_NOBUF', 'buffer meta ' .. K.meta .. ' does not exist')
end
local ids = unpack_ids(ARGV[1], tonumber(ARGV[2]))
if #ids > RB_MAX_ITEMS then
  return fail('RB_LIMIT', 'one command removes at most ' .. RB_MAX_ITEMS .. ' ids, asked '
    .. #ids)
end
local present, seen = {}, {}
local scores = zmscore_chunked(K.order, ids)
for i = 1, #ids do
  if scores[i] and not seen[ids[i]] then
    seen[ids[i]] = true
    present[#present + 1] = ids[i]
  end
end
if #present == 0 then return 0 end
remove_items(K, present)
redis.call('HINCRBY', K.meta, 'deleted', #present)
notify_changed(K.meta)  -- a rate limiter counts the size: inserts may go on
return #present
