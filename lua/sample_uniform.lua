-- Draw item ids uniformly.
-- @include common
-- @include masslog
-- @include items
-- @keys 13..14
-- @retry draw
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order (see
-- buffer_keys in _common.lua)
-- ARGV[1] n  ARGV[2] "1" = with replacement, "0" = without  ARGV[3] "1" = also return blobs
-- ARGV[4] n uniforms in [0, 1), packed 6 bytes each (see uniform_at)
-- ARGV[5], ARGV[6] (optional, guess mode): the first id and the length the caller assumed,
-- ARGV[7] the n ids it computed from its uniforms for that range with the algorithm below
-- (UniformSampler in redisbuf/sampling/samplers.py), 12 characters each (id_str), concatenated;
-- ARGV[4] is then not used. The script draws nothing and records those ids as drawn if
-- the buffer holds exactly the ids first .. first + length - 1, the only case where its
-- own draw gives the same ids; otherwise it records nothing.
-- Without replacement (and n <= len) every n-subset is equally likely (sparse
-- Fisher-Yates over insertion ranks); with replacement (or n > len) each draw is
-- independent and uniform. Randomness comes from the caller, so results are reproducible.
-- Returns {len, first, id_1..id_n} and, if asked, {blob_1..blob_n} after them (fetching
-- blobs here is atomic but costs the server far more than a separate HMGET); in guess mode
-- {len, first, 1 if the ids were recorded else 0}. len is the number of items present,
-- first the lowest id when the ids present are exactly first .. first + len - 1 (no
-- holes), else -1.
-- Errors: RB_EMPTY.
local K = buffer_keys(KEYS)
local items, order = K.items, K.order
local n = tonumber(ARGV[1])
if n == nil or n < 0 or n ~= math.floor(n) then
  return fail('RB_INVALID', 'ARGV[1] must be the number of draws, got ' .. tostring(ARGV[1]))
end
if n > RB_MAX_ITEMS and ARGV[5] ~= 'scan' then
  return fail('RB_LIMIT', 'one command draws at most ' .. RB_MAX_ITEMS .. ' items, asked '
    .. n .. ' (split the draw into several commands)')
end
if #ARGV[4] > 6 * RB_MAX_ITEMS then
  return fail('RB_LIMIT', 'one command takes at most ' .. RB_MAX_ITEMS .. ' uniforms')
end
local chunk_mode = ARGV[5] == 'exclude' or ARGV[5] == 'scan'
if chunk_mode then
  if KEYS[14] == nil or ARGV[2] ~= '0' or #ARGV[4] % 6 ~= 0 then
    return fail('RB_INVALID', 'chunk mode takes KEYS[14], ARGV[2] "0" and packed uniforms')
  end
  local len = redis.call('ZCARD', order)
  if len == 0 then return fail('RB_EMPTY', 'buffer is empty') end
  local drawn, count, kept, out = KEYS[14], #ARGV[4] / 6, {}, {}
  local cursor = 0
  if ARGV[5] == 'scan' then
    cursor = tonumber(ARGV[6])
    local ahead = redis.call('ZCOUNT', order, '(' .. cursor, '+inf')
    local read = redis.call('ZRANGEBYSCORE', order, '(' .. cursor, '+inf', 'LIMIT', 0, count)
    for i = 1, #read do
      if #kept < n and uniform_at(ARGV[4], i) * ahead < n - #kept then
        kept[#kept + 1] = read[i]
      end
      ahead = ahead - 1
    end
    if #read > 0 then cursor = tonumber(read[#read]) else cursor = -1 end
  else
    local first = tonumber(redis.call('ZRANGE', order, 0, 0)[1])
    local last = tonumber(redis.call('ZRANGE', order, -1, -1)[1])
    local contiguous = last - first + 1 == len
    cursor = contiguous and first or -1
    local seen = {}
    for i = 1, count do
      if #kept >= n then break end
      local rank = math.floor(uniform_at(ARGV[4], i) * len)
      local id
      if contiguous then id = id_str(first + rank) else id = redis.call('ZRANGE', order, rank, rank)[1] end
      if not seen[id] then
        seen[id] = true
        if redis.call('SISMEMBER', drawn, id) == 0 then kept[#kept + 1] = id end
      end
    end
  end
  local blobs
  if ARGV[3] == '1' and #kept > 0 then blobs = hmget_chunked(items, kept) end
  record_draws(K, kept)
  if not RB_NO_WRITES and #kept > 0 then
    call_chunked('SADD', drawn, kept)
    redis.call('PEXPIRE', drawn, 60000)
  end
  out[1], out[2] = len, cursor
  for i = 1, #kept do out[2 + i] = kept[i] end
  if blobs then
    for i = 1, #kept do out[2 + #kept + i] = blobs[i] end
  end
  return out
end
local guess = ARGV[5] ~= nil
if guess and #ARGV[7] ~= 12 * n then return fail('RB_INVALID', 'expected ' .. n .. ' ids') end
if not guess and #ARGV[4] ~= 6 * n then
  return fail('RB_INVALID', 'expected ' .. n .. ' packed uniforms')
end
local len = redis.call('ZCARD', order)
if len == 0 then return fail('RB_EMPTY', 'buffer is empty') end
local replace = ARGV[2] == '1' or n > len
-- With no holes in the ids (FIFO eviction only), rank r is simply id first + r.
local first = tonumber(redis.call('ZRANGE', order, 0, 0)[1])
local last = tonumber(redis.call('ZRANGE', order, -1, -1)[1])
local contiguous = last - first + 1 == len
if guess then
  if not (contiguous and tonumber(ARGV[5]) == first and tonumber(ARGV[6]) == len) then
    return {len, contiguous and first or -1, 0}
  end
  local guessed, packed = {}, ARGV[7]
  for i = 1, n do guessed[i] = string.sub(packed, 12 * i - 11, 12 * i) end
  record_draws(K, guessed)
  return {len, first, 1}
end
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
local out = {len, contiguous and first or -1}
for i = 1, n do out[2 + i] = ids[i] end
if blobs then
  for i = 1, n do out[2 + n + i] = blobs[i] end
end
return out
