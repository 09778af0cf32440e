-- Build the per_heap zset (PER priorities in order, for the MaxHeap / MinHeap selectors by
-- priority) from a building process's replica of the priorities (the server keeps no
-- per-item priority: lua/_masslog.lua), one bounded slice a call, so that no call holds
-- the server long however full the buffer. "start" sets meta per_heap = b: from then on
-- every change to a PER priority (add, update, removal) is made in the heap too
-- (lua/_items.lua, lua/update_priority.lua); the builder then catches its replica up (to
-- a version at or after the start) and copies it in slices, each id only if stored and
-- not in the heap already (ZADD NX): an id in the heap was written since the start, by
-- a change at least as new as the replica's. "finish" sets per_heap = 1 and
-- lua/sample_select.lua draws from it. A clear, a load or a session switch meanwhile (a
-- new log epoch) makes the slices refuse: the builder starts again.
-- @include common
-- @include masslog
-- @include items
-- @keys 13
-- @retry safe
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order
-- ARGV[1] "start" | "slice" | "finish"  ARGV[2] (slice, finish) the log epoch "start"
-- returned  ARGV[3] (slice) the ids, 12 digits each, back to back  ARGV[4] (slice) their
-- priorities, big-endian IEEE 754 doubles (at most RB_MAX_ITEMS ids)
-- Returns, for "start": {1} when the heap is built, else {0, epoch} (build from a replica
-- of that epoch); for "slice" and "finish": 1 when done, 0 when the build must start again.
-- Errors: RB_NOBUF, RB_CONFIG (the buffer has no PER priorities), RB_INVALID, RB_LIMIT.
local K = buffer_keys(KEYS)
local conf = redis.call('HMGET', K.meta, 'capacity', 'mass', 'per_heap', 'per_heap_epoch',
  'log_epoch')
if not conf[1] then return fail('RB_NOBUF', 'buffer meta ' .. K.meta .. ' does not exist') end
if conf[2] ~= 'per' then
  return fail('RB_CONFIG', 'buffer ' .. K.meta .. ' has no PER priorities (use PERSampler)')
end
local step = ARGV[1]
if step == 'start' then
  if conf[3] == '1' then return {1} end
  if conf[3] ~= 'b' or conf[4] ~= conf[5] then
    redis.call('UNLINK', K.per_heap)
    redis.call('HSET', K.meta, 'per_heap', 'b', 'per_heap_epoch', conf[5] or '')
  end
  return {0, conf[5] or ''}
end
if conf[3] ~= 'b' or conf[4] ~= ARGV[2] or conf[5] ~= ARGV[2] then return 0 end
if step == 'finish' then
  redis.call('HSET', K.meta, 'per_heap', '1')
  redis.call('HDEL', K.meta, 'per_heap_epoch', 'per_heap_cursor')
  return 1
end
if step ~= 'slice' then return fail('RB_INVALID', 'unknown step ' .. tostring(step)) end
local ids, packed = ARGV[3] or '', ARGV[4] or ''
local k = #ids / 12
if k ~= math.floor(k) or #packed ~= 8 * k then
  return fail('RB_INVALID', 'a slice is 12-digit ids and 8 bytes of priority per id')
end
if k > RB_MAX_ITEMS then
  return fail('RB_LIMIT', 'one slice holds at most ' .. RB_MAX_ITEMS .. ' ids, got ' .. k)
end
local scored = {}
for i = 1, k do
  local id = string.sub(ids, 12 * i - 11, 12 * i)
  if redis.call('HEXISTS', K.items, id) == 1 then
    scored[#scored + 1] = fmt(double_at(packed, 8 * i - 7))
    scored[#scored + 1] = id
  end
end
for i = 1, #scored, 2 * CHUNK do
  redis.call('ZADD', K.per_heap, 'NX', unpack(scored, i, math.min(i + 2 * CHUNK - 1, #scored)))
end
return 1
