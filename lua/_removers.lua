-- Removers: which items leave a full buffer, a helper scripts name with
-- "-- @include removers" (Reverb's remover selectors; redisbuf/sampling/removers.py).
-- Meta eviction: "fifo" (oldest first) and "reward" (lowest log-reward first) evict the
-- excess of a batch at once, new items included under "reward". The others follow
-- Reverb's table, one new item at a time in batch order: when the buffer is full before
-- item i enters, one item is removed first, chosen among the items present then (the
-- buffer's items and this batch's items before i; never i or a later one):
--   "lifo"           the newest (a batch's items are newer than every other);
--   "uniform"        uniformly at random;
--   "prioritized:E"  with probability p^E / sum p^E over PER priorities p (0^E = 0; all
--                    zero: uniformly), by rejection against meta per_max (a bound on
--                    every priority present), then an exact scan after MAX_REJECTIONS;
--   "max_heap", "min_heap"  the highest / lowest PER priority, the oldest first among
--                    equals.
-- The removers by PER priority read the priorities from the per_heap zset: the server keeps
-- no other per-item copy (lua/_masslog.lua), so such a buffer keeps the heap from its start
-- (redisbuf/sampling/removers.py builds it when the buffer is opened; a load swaps in a
-- whole one, lua/restore.lua); an add refuses (removers_ready) while none is kept. While
-- a build is under way (meta per_heap = b), an item not yet copied into it weighs 0.
-- The random ones take their uniforms from options.evict_u (numbers in [0, 1)), then
-- from a generator seeded by the last of them.
-- @include common
-- @include items

local MAX_REJECTIONS = 4096

-- A stream of uniforms in [0, 1): the given ones, then a 48-bit linear congruential
-- generator (Knuth's MMIX constants, reduced to what doubles hold exactly) seeded by
-- the last given one.
local function uniform_stream(given)
  local i, state = 0, 12345
  if given and #given > 0 then state = math.floor(given[#given] * 2 ^ 31) + 1 end
  return function()
    i = i + 1
    if given and given[i] then return given[i] end
    state = (state * 25214903917 + 11) % 281474976710656
    return state / 281474976710656
  end
end

local function needs_per(mode)
  return mode == 'max_heap' or mode == 'min_heap' or string.sub(mode, 1, 12) == 'prioritized:'
end

-- Nil, or an RB_NOHEAP error reply when eviction `mode` reads PER priorities and the
-- buffer keeps no heap of them: an add script asks before its first write.
local function removers_ready(K, mode)
  if mode and needs_per(mode) and not heap_kept(K) then
    return fail('RB_NOHEAP', 'the priority heap of ' .. K.meta .. ', which its remover reads, '
      .. 'is not built: open the buffer with its remover (that builds it) and add again')
  end
  return nil
end

-- Whether `mode` is a remover this file implements (not "fifo" / "reward").
local function per_item_remover(mode)
  return mode == 'lifo' or mode == 'uniform' or needs_per(mode)
end

-- The oldest id among the highest (max) or lowest (min) scores of the per_heap zset,
-- skipping ids in `skip`; nil when none is left. Equal scores are ordered by id (oldest
-- first) in the zset: ascending for min, and for max the highest eligible score is found
-- first, then its oldest eligible id.
local function first_kept(list, skip, step)
  for j = 1, #list, step do
    if not skip[list[j]] then return list[j], list[j + 1] end
  end
  return nil, nil
end

local function heap_pick(K, max, skip)
  local offset, window = 0, 16
  local score
  while true do
    local part
    if max then
      part = redis.call('ZREVRANGE', K.per_heap, offset, offset + window - 1, 'WITHSCORES')
    else
      part = redis.call('ZRANGE', K.per_heap, offset, offset + window - 1, 'WITHSCORES')
    end
    if #part == 0 then return nil end
    local id
    id, score = first_kept(part, skip, 2)
    if id then
      if not max then return id end
      break
    end
    offset = offset + window
    window = window * 2
  end
  offset = 0
  while true do
    local group = redis.call('ZRANGEBYSCORE', K.per_heap, score, score, 'LIMIT', offset, 64)
    if #group == 0 then return nil end
    local id = first_kept(group, skip, 1)
    if id then return id end
    offset = offset + 64
  end
end

-- The eligible item at a uniformly random rank of the order zset, or nil after too many
-- rejections (the caller scans). skip: ids not eligible.
local function uniform_pick(K, next_u, skip, tries)
  local total = redis.call('ZCARD', K.order)
  if total == 0 then return nil end
  for _ = 1, tries do
    local rank = math.floor(next_u() * total)
    local id = redis.call('ZRANGE', K.order, rank, rank)[1]
    if id and not skip[id] then return id end
  end
  return nil
end

-- Every eligible id with its weight (PER priority ^ exponent from the heap, or 1), for the
-- exact scan.
local function eligible_weights(K, skip, exponent)
  local ids = redis.call('ZRANGE', K.order, 0, -1)
  local kept, weights = {}, {}
  for _, id in ipairs(ids) do
    if not skip[id] then kept[#kept + 1] = id end
  end
  if exponent then
    local texts = zmscore_chunked(K.per_heap, kept)
    for j = 1, #kept do
      local p = tonumber(texts[j]) or 0
      weights[j] = (p == 0) and 0 or p ^ exponent
    end
  else
    for j = 1, #kept do weights[j] = 1 end
  end
  return kept, weights
end

local function weighted_pick(ids, weights, u)
  local total = 0
  for j = 1, #weights do total = total + weights[j] end
  if total <= 0 then
    if #ids == 0 then return nil end
    return ids[math.min(#ids, math.floor(u * #ids) + 1)]
  end
  local target, acc = u * total, 0
  for j = 1, #ids do
    acc = acc + weights[j]
    if target < acc and weights[j] > 0 then return ids[j] end
  end
  for j = #ids, 1, -1 do
    if weights[j] > 0 then return ids[j] end
  end
  return nil
end

local function prioritized_pick(K, next_u, skip, exponent)
  local top = tonumber(redis.call('HGET', K.meta, 'per_max')) or 0
  if top > 0 then
    local bound = top ^ exponent
    for _ = 1, MAX_REJECTIONS do
      local id = uniform_pick(K, next_u, skip, 64)
      if id == nil then break end
      local p = tonumber(redis.call('ZSCORE', K.per_heap, id)) or 0
      local w = (p == 0) and 0 or p ^ exponent
      if next_u() * bound < w then return id end
    end
  end
  local ids, weights = eligible_weights(K, skip, exponent)
  return weighted_pick(ids, weights, next_u())
end

-- The victims of a batch under a per-item remover: `ids` the batch's ids (stored
-- already), `excess` how many items must go. Returns them in the order chosen (new items
-- may be among them: an item that entered and was removed by a later one).
local function remover_victims(K, mode, ids, excess, options)
  local n = #ids
  local skip, victims = {}, {}
  for i = 1, n do skip[ids[i]] = true end
  local next_u = uniform_stream(options and options.evict_u)
  local exponent
  if string.sub(mode, 1, 12) == 'prioritized:' then exponent = tonumber(string.sub(mode, 13)) end
  -- the first (n - excess) items of the batch enter without removing anything
  local first = n - excess + 1
  for i = 1, first - 1 do skip[ids[i]] = nil end
  for i = first, n do
    -- item i: the batch's items before it are eligible, it and the later ones are not
    local victim
    if mode == 'lifo' then
      if i > 1 and not skip[ids[i - 1]] then
        victim = ids[i - 1]
      else
        local offset = 0
        while victim == nil do
          local part = redis.call('ZREVRANGE', K.order, offset, offset + 63)
          if #part == 0 then break end
          for _, id in ipairs(part) do
            if not skip[id] then victim = id break end
          end
          offset = offset + 64
        end
      end
    elseif mode == 'uniform' then
      victim = uniform_pick(K, next_u, skip, MAX_REJECTIONS)
      if victim == nil then
        local kept, weights = eligible_weights(K, skip, nil)
        victim = weighted_pick(kept, weights, next_u())
      end
    elseif exponent then
      victim = prioritized_pick(K, next_u, skip, exponent)
    else  -- max_heap / min_heap: the heap is kept (removers_ready)
      victim = heap_pick(K, mode == 'max_heap', skip)
    end
    if victim == nil then break end
    victims[#victims + 1] = victim
    skip[victim] = true
    skip[ids[i]] = nil
  end
  return victims
end
