-- Draw item ids uniformly.
-- @include common
-- @include tree
-- @include items
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order (see
-- buffer_keys in _common.lua)
-- ARGV[1] n  ARGV[2] "1" = with replacement, "0" = without  ARGV[3] "1" = also return blobs
-- ARGV[4] n uniforms in [0, 1), packed 6 bytes each (see uniform_at)
-- Without replacement (and n <= len) every n-subset is equally likely (sparse
-- Fisher-Yates over insertion ranks); with replacement (or n > len) each draw is
-- independent and uniform. Randomness comes from the caller, so results are reproducible.
-- Returns {id_1..id_n} and, if asked, {blob_1..blob_n} after them (fetching blobs here is
-- atomic but costs the server far more than a separate HMGET).
-- Errors: RB_EMPTY.
local K = buffer_keys(KEYS)
local items, order = K.items, K.order
local n = tonumber(ARGV[1])
if #ARGV[4] ~= 6 * n then return fail('RB_INVALID', 'expected ' .. n .. ' packed uniforms') end
local len = redis.call('ZCARD', order)
if len == 0 then return fail('RB_EMPTY', 'buffer is empty') end
local replace = ARGV[2] == '1' or n > len
-- With no holes in the ids (FIFO eviction only), rank r is simply id first + r.
local first = tonumber(redis.call('ZRANGE', order, 0, 0)[1])
local last = tonumber(redis.call('ZRANGE', order, -1, -1)[1])
local contiguous = last - first + 1 == len
local ids = {}
local swapped = {}
for i = 1, n do
  local u = uniform_at(ARGV[4], i)
  local rank
  if replace then
    rank = math.floor(u * len)
  else
    local j = (i - 1) + math.floor(u * (len - i + 1))
    rank = swapped[j] or j
    swapped[j] = swapped[i - 1] or (i - 1)
  end
  if contiguous then
    ids[i] = id_str(first + rank)
  else
    ids[i] = redis.call('ZRANGE', order, rank, rank)[1]
  end
end
local blobs
if ARGV[3] == '1' then blobs = hmget_chunked(items, ids) end
record_draws(K, ids)  -- after reading the blobs: it may remove used-up items
if blobs then
  for i = 1, n do ids[n + i] = blobs[i] end
end
return ids
