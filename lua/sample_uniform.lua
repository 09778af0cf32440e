-- Draw items uniformly and return them.
-- @include common
-- KEYS[1] meta  KEYS[2] items  KEYS[3] order
-- ARGV[1] n  ARGV[2] "1" = with replacement, "0" = without  ARGV[3..n+2] uniforms in [0, 1)
-- Without replacement (and n <= len) every n-subset is equally likely (sparse
-- Fisher-Yates over insertion ranks); with replacement (or n > len) each draw is
-- independent and uniform. Randomness comes from the caller, so results are reproducible.
-- Returns {id_1..id_n, blob_1..blob_n}. Errors: RB_EMPTY.
local meta, items, order = KEYS[1], KEYS[2], KEYS[3]
local n = tonumber(ARGV[1])
local len = redis.call('ZCARD', order)
if len == 0 then return fail('RB_EMPTY', 'buffer is empty') end
local replace = ARGV[2] == '1' or n > len
local ids = {}
local swapped = {}
for i = 1, n do
  local u = tonumber(ARGV[2 + i])
  local rank
  if replace then
    rank = math.floor(u * len)
  else
    local j = (i - 1) + math.floor(u * (len - i + 1))
    rank = swapped[j] or j
    swapped[j] = swapped[i - 1] or (i - 1)
  end
  ids[i] = redis.call('ZRANGE', order, rank, rank)[1]
end
local blobs = hmget_chunked(items, ids)
redis.call('HINCRBY', meta, 'sampled', n)
for i = 1, n do ids[n + i] = blobs[i] end
return ids
