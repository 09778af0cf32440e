-- Draw item ids uniformly among the items at some positions of the insertion order (a
-- Python slice: DI-engine's sample_range, ALF's recent data).
-- @include common
-- @include masslog
-- @include items
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order
-- ARGV[1] n  ARGV[2] "1" = with replacement, "0" = without
-- ARGV[3] start  ARGV[4] stop  ARGV[5] step  (integers as text; "" = None, as in a slice)
-- ARGV[6] "1" = also return blobs  ARGV[7] n uniforms in [0, 1), packed 6 bytes each
-- Positions count from 0 = the oldest item present, negative ones from the newest, and
-- are resolved as Python's slice.indices(length) does, atomically with the draw. Without
-- replacement (and n <= the window's size) every n-subset of the window is equally likely;
-- otherwise draws are independent. Returns {id_1..id_n} and, if asked, {blob_1..blob_n}.
-- Errors: RB_EMPTY (nothing in the window), RB_INVALID, RB_LIMIT (n above RB_MAX_ITEMS,
-- redisbuf/store/bounds.py).
local K = buffer_keys(KEYS)
local n = tonumber(ARGV[1])
if n == nil or n > RB_MAX_ITEMS then
  return fail('RB_LIMIT', 'one command draws at most ' .. RB_MAX_ITEMS .. ' items, asked '
    .. tostring(ARGV[1]))
end
if #ARGV[7] ~= 6 * n then return fail('RB_INVALID', 'expected ' .. n .. ' packed uniforms') end
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
