-- Select items in a fixed order instead of at random (Reverb's Fifo, Lifo, MaxHeap and
-- MinHeap selectors).
-- @include common
-- @include masslog
-- @include items
-- @include admission
-- @keys 13
-- @retry draw
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order
-- ARGV[1] n  ARGV[2] order: "fifo" | "lifo" | "max" | "min"
-- ARGV[3] heap score: "log_reward" (prio zset) | "priority" (PER priorities: the per_heap
-- zset, built from the per hash by lua/heap_build.lua a bounded slice at a time, and kept
-- in step by every change from the build's start, see lua/_items.lua)
-- ARGV[4] "1" = also return blobs  ARGV[5] "successive" (Reverb's successive
-- selections, below), "successive+admit" (the same, n first cut to what the buffer's rate
-- limiter admits, lua/_admission.lua, and the selections counted as its samples, in this
-- one step: a sample counted has removed its items before an insert may take their room)
-- or "" (the samplers' uniforms slot)
-- Returns the first n ids of the order, {id_1..id_n}, and, if asked, {blob_1..blob_n}
-- after them: fifo = oldest first, lifo = newest first, max / min = highest / lowest score
-- first with the oldest first among equal scores. When n exceeds the length the order
-- repeats. Successive selections are n selections of the first item of the order, each
-- made after the earlier ones were counted: without max_use all n are the first item;
-- with it, each item is selected until its uses reach max_use (then it is removed and
-- the next is first), and when the items hold fewer uses than n, the reply has that many
-- ids (and blobs), and with "admit" none (an empty reply) when the limiter admits none.
-- O(log len + n). Errors: RB_EMPTY, RB_CONFIG (no PER priorities),
-- RB_LIMIT (n above RB_MAX_ITEMS, redisbuf/store/bounds.py), RB_NOHEAP (by priority
-- before the heap is built).
local K = buffer_keys(KEYS)
local n, mode = tonumber(ARGV[1]), ARGV[2]
if n == nil or n > RB_MAX_ITEMS then
  return fail('RB_LIMIT', 'one command draws at most ' .. RB_MAX_ITEMS .. ' items, asked '
    .. tostring(ARGV[1]))
end
local source = K.order
if (mode == 'max' or mode == 'min') and ARGV[3] ~= 'priority' and not rewards_kept(K) then
  mode = 'fifo'  -- no log-rewards stored: all are 0, and equal scores go oldest first
elseif mode == 'max' or mode == 'min' then
  source = K.prio
  if ARGV[3] == 'priority' then
    if redis.call('HGET', K.meta, 'mass') ~= 'per' then
      return fail('RB_CONFIG', 'buffer ' .. K.meta .. ' has no PER priorities (use PERSampler)')
    end
    if redis.call('HGET', K.meta, 'per_heap') ~= '1' then
      return fail('RB_NOHEAP', 'the priority heap of ' .. K.meta .. ' is not built yet: '
        .. 'build it with lua/heap_build.lua (a slice a call) and call again')
    end
    source = K.per_heap
  end
end
local admit = ARGV[5] == 'successive+admit'
if admit then
  n = samples_admitted(K.meta, K.order, n)
  if n == 0 then return {} end
end
local len = redis.call('ZCARD', K.order)
if len == 0 then return fail('RB_EMPTY', 'buffer is empty') end
local m = math.min(n, len)
local seq
if mode == 'fifo' or mode == 'min' then
  seq = redis.call('ZRANGE', source, 0, m - 1)
elseif mode == 'lifo' then
  seq = redis.call('ZREVRANGE', source, 0, m - 1)
else
  -- ZREVRANGE puts the newest first among equal scores: regroup each score oldest first
  local top = redis.call('ZREVRANGE', source, 0, m - 1, 'WITHSCORES')
  local scores, counts = {}, {}
  for i = 2, #top, 2 do
    if scores[#scores] ~= top[i] then
      scores[#scores + 1] = top[i]
      counts[#scores] = 0
    end
    counts[#scores] = counts[#scores] + 1
  end
  seq = {}
  for g = 1, #scores do
    local group = redis.call('ZRANGEBYSCORE', source, scores[g], scores[g], 'LIMIT', 0, counts[g])
    for _, id in ipairs(group) do seq[#seq + 1] = id end
  end
end
local ids = {}
if ARGV[5] == 'successive' or admit then
  local max_use = tonumber(redis.call('HGET', K.meta, 'max_use'))
  if not max_use then
    for i = 1, n do ids[i] = seq[1] end
  else
    local uses = hmget_chunked(K.uses, seq)
    for j = 1, #seq do
      local left = max_use - (tonumber(uses[j]) or 0)
      for _ = 1, left do
        if #ids == n then break end
        ids[#ids + 1] = seq[j]
      end
      if #ids == n then break end
    end
    n = #ids
  end
else
  for i = 1, n do ids[i] = seq[(i - 1) % m + 1] end
end
local blobs
if ARGV[4] == '1' then blobs = hmget_chunked(K.items, ids) end
if admit and n > 0 and redis.call('HEXISTS', K.meta, 'rl_spi') == 1 then
  redis.call('HINCRBY', K.meta, 'rl_samples', n)
  notify_changed(K.meta)
end
record_draws(K, ids)  -- after reading the blobs: it may remove used-up items
if blobs then
  for i = 1, n do ids[n + i] = blobs[i] end
end
return ids
