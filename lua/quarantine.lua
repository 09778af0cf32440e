-- Set aside stored records that do not decode (a foreign writer's garbage: rb_add stores
-- records without looking inside them), so that no sampler draws them again: each one's
-- blob moves to the quarantine hash under its id, and the item leaves every per-item
-- structure as an eviction removes it (remove_items: order, priorities, PER, uses, ...,
-- and a mass-log entry, so samplers' replicas stop drawing it). Called by
-- redisbuf/buffers/quarantine.py after a sampled blob failed to decode on its own.
-- @include common
-- @include masslog
-- @include items
-- @keys 14
-- @retry never
-- KEYS[1] meta  KEYS[2..13] the buffer's other keys, in BufferKeys.all_keys() order (see
-- buffer_keys in _common.lua)  KEYS[14] the quarantine hash (rb:{name}:quarantine: item
-- id -> blob)
-- ARGV[1..] pairs: the id (stored form, 12 digits) of a record to set aside, and its blob
-- as the caller read it (the draw that read it may have removed it already: max_use)
-- Each blob is written to the quarantine hash unless its id is there already (another
-- process set it aside first); the item, if still stored, is removed. Meta quarantined
-- counts the records ever set aside (a clear keeps it and the quarantine hash: they
-- record what a writer sent; drop deletes both). Returns the number of records newly set
-- aside. Errors: RB_NOBUF, RB_LIMIT, RB_INVALID (an odd number of arguments).
local K = buffer_keys(KEYS)
local quarantine = KEYS[14]
if #ARGV % 2 == 1 then
  return fail('RB_INVALID', 'expected pairs of id and blob, got ' .. #ARGV .. ' arguments')
end
if #ARGV > 2 * RB_MAX_ITEMS then
  return fail('RB_LIMIT', 'one call sets aside at most ' .. RB_MAX_ITEMS .. ' records, got '
    .. #ARGV / 2)
end
if redis.call('EXISTS', K.meta) == 0 then
  return fail('RB_NOBUF', 'buffer meta ' .. K.meta .. ' does not exist')
end
local stored, new = {}, 0
for i = 1, #ARGV, 2 do
  new = new + redis.call('HSETNX', quarantine, ARGV[i], ARGV[i + 1])
  if redis.call('HEXISTS', K.items, ARGV[i]) == 1 then
    stored[#stored + 1] = ARGV[i]
    redis.call('HDEL', K.items, ARGV[i])  -- so that an id named twice is removed once
  end
end
remove_items(K, stored)
if new > 0 then redis.call('HINCRBY', K.meta, 'quarantined', new) end
if #stored > 0 then notify_changed(K.meta) end
return new
