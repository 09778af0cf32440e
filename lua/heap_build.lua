-- Build the per_heap zset (PER priorities in order, for the MaxHeap / MinHeap selectors by
-- priority) from the per hash, one bounded slice a call, so that no call holds the server
-- long however full the buffer. The first call sets meta per_heap = b: from then on every
-- change to a PER priority (add, update, removal) is made in the heap too
-- (lua/_items.lua), so the items a slice copies are current when copied and stay so;
-- the last slice sets per_heap = 1 and lua/sample_select.lua draws from it. A clear or a
-- session switch meanwhile empties both (the next slices scan the new per hash).
-- @include common
-- @include masslog
-- @include items
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order
-- ARGV: none
-- Returns 1 when the heap is built, 0 when more calls are needed.
-- Errors: RB_NOBUF, RB_CONFIG (the buffer has no PER priorities).
local K = buffer_keys(KEYS)
local conf = redis.call('HMGET', K.meta, 'capacity', 'tree_mass', 'per_heap', 'per_heap_cursor')
if not conf[1] then return fail('RB_NOBUF', 'buffer meta ' .. K.meta .. ' does not exist') end
if conf[2] ~= 'per' then
  return fail('RB_CONFIG', 'buffer ' .. K.meta .. ' has no PER priorities (use PERSampler)')
end
if conf[3] == '1' then return 1 end
local cursor = conf[4]
if conf[3] ~= 'b' or not cursor then
  redis.call('UNLINK', K.per_heap)
  redis.call('HSET', K.meta, 'per_heap', 'b')
  cursor = '0'
end
local reply = redis.call('HSCAN', K.per, cursor, 'COUNT', RB_MAX_ITEMS)
local flat, scored = reply[2], {}
for i = 1, #flat, 2 do
  scored[#scored + 1] = flat[i + 1]
  scored[#scored + 1] = flat[i]
end
if #scored > 0 then call_chunked('ZADD', K.per_heap, scored) end
if reply[1] == '0' then
  redis.call('HSET', K.meta, 'per_heap', '1')
  redis.call('HDEL', K.meta, 'per_heap_cursor')
  return 1
end
redis.call('HSET', K.meta, 'per_heap_cursor', reply[1])
return 0
