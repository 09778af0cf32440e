-- Draw item ids uniformly among the items at some positions of the insertion order (a
-- Python slice: DI-engine's sample_range, ALF's recent data).
-- @include common
-- @include masslog
-- @include items
-- @keys 13..14
-- @retry draw
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order
-- ARGV[1] n  ARGV[2] "1" = with replacement, "0" = without
-- ARGV[3] start  ARGV[4] stop  ARGV[5] step  (integers as text; "" = None, as in a slice)
-- ARGV[6] "1" = also return blobs  ARGV[7] n uniforms in [0, 1), packed 6 bytes each
-- Positions count from 0 = the oldest item present, negative ones from the newest, and
-- are resolved as Python's slice.indices(length) does, atomically with the draw. Without
-- replacement (and n <= the window's size) every n-subset of the window is equally likely;
-- otherwise draws are independent. Returns {id_1..id_n} and, if asked, {blob_1..blob_n}.
-- Chunk mode, ARGV[8] "exclude" (one command of a larger draw without replacement,
-- WindowSampler in redisbuf/sampling/windows.py): KEYS[14] is the draw's set of the ids
-- returned so far (under the buffer's tag; PEXPIRE 60 s), ARGV[2] is "0" and ARGV[7]
-- holds up to RB_MAX_ITEMS uniforms, each a candidate position of the window; the
-- candidates not in the set (nor taken already by this command) are kept, in order, up
-- to n of them, recorded as drawn and added to the set. Each kept id is so uniform among
-- the window's items the earlier commands did not return. Returns {size of the window,
-- id_1..id_k} and, if asked, {blob_1..blob_k} after them.
-- Errors: RB_EMPTY (nothing in the window), RB_INVALID, RB_LIMIT (n above RB_MAX_ITEMS,
-- redisbuf/store/bounds.py).
local K = buffer_keys(KEYS)
local n = tonumber(ARGV[1])
if n == nil or n > RB_MAX_ITEMS then
  return fail('RB_LIMIT', 'one command draws at most ' .. RB_MAX_ITEMS .. ' items, asked '
    .. tostring(ARGV[1]))
end
local chunk_mode = ARGV[8] == 'exclude'
if chunk_mode then
  if KEYS[14] == nil or ARGV[2] ~= '0' or #ARGV[7] % 6 ~= 0 then
    return fail('RB_INVALID', 'chunk mode takes KEYS[14], ARGV[2] "0" and packed uniforms')
  end
  if #ARGV[7] > 6 * RB_MAX_ITEMS then
    return fail('RB_LIMIT', 'one command takes at most ' .. RB_MAX_ITEMS .. ' uniforms')
  end
elseif #ARGV[7] ~= 6 * n then
  return fail('RB_INVALID', 'expected ' .. n .. ' packed uniforms')
end
local len = redis.call('ZCARD', K.order)
local step = 1
if ARGV[5] ~= '' then step = tonumber(ARGV[5]) end
if step == 0 then return fail('RB_INVALID', 'slice step cannot be zero') end
local lower, upper = 0, len
if step < 0 then lower, upper = -1, len - 1 end
local function bound(text, default)
  if text == '' then return default end
  local v = tonumber(text)
  if v < 0 then
    v = v + len
    if v < lower then v = lower end
  elseif v > upper then
    v = upper
  end
  return v
end
local start = bound(ARGV[3], step < 0 and upper or lower)
local stop = bound(ARGV[4], step < 0 and lower or upper)
local count
if step > 0 then
  count = math.floor((stop - start + step - 1) / step)
else
  count = math.floor((start - stop - step - 1) / -step)
end
if count <= 0 then
  return fail('RB_EMPTY', 'no item in sample_range (' .. len .. ' items present)')
end
local replace = ARGV[2] == '1' or n > count
local first = tonumber(redis.call('ZRANGE', K.order, 0, 0)[1])
local last = tonumber(redis.call('ZRANGE', K.order, -1, -1)[1])
local contiguous = last - first + 1 == len
local function id_at(k)
  local rank = start + k * step
  if contiguous then return id_str(first + rank) end
  return redis.call('ZRANGE', K.order, rank, rank)[1]
end
if chunk_mode then
  local drawn, kept, seen = KEYS[14], {}, {}
  for i = 1, #ARGV[7] / 6 do
    if #kept >= n then break end
    local id = id_at(math.floor(uniform_at(ARGV[7], i) * count))
    if not seen[id] then
      seen[id] = true
      if redis.call('SISMEMBER', drawn, id) == 0 then kept[#kept + 1] = id end
    end
  end
  local blobs
  if ARGV[6] == '1' and #kept > 0 then blobs = hmget_chunked(K.items, kept) end
  record_draws(K, kept)  -- after reading the blobs: it may remove used-up items
  if not RB_NO_WRITES and #kept > 0 then
    call_chunked('SADD', drawn, kept)
    redis.call('PEXPIRE', drawn, 60000)
  end
  local out = {count}
  for i = 1, #kept do out[1 + i] = kept[i] end
  if blobs then
    for i = 1, #kept do out[1 + #kept + i] = blobs[i] end
  end
  return out
end
local ids, swapped = {}, {}
for i = 1, n do
  local u = uniform_at(ARGV[7], i)
  local k
  if replace then
    k = math.floor(u * count)
  else
    local j = (i - 1) + math.floor(u * (count - i + 1))
    k = swapped[j] or j
    swapped[j] = swapped[i - 1] or (i - 1)
  end
  local rank = start + k * step
  if contiguous then
    ids[i] = id_str(first + rank)
  else
    ids[i] = redis.call('ZRANGE', K.order, rank, rank)[1]
  end
end
local blobs
if ARGV[6] == '1' then blobs = hmget_chunked(K.items, ids) end
record_draws(K, ids)  -- after reading the blobs: it may remove used-up items
if blobs then
  for i = 1, n do ids[n + i] = blobs[i] end
end
return ids
