-- Free the chunks of a step store (redisbuf/buffers/steps.py) that no item references
-- any longer, a bounded number of chunks a call: the oldest ones, the ones after the
-- sweep's cursor (which cycles through every chunk) and those found unreferenced at
-- least a grace period ago. A chunk is referenced while one of the items its refs name
-- ("I:ID", the newest first) is in buffer I's items hash. One found unreferenced is
-- marked (dead: server ms) and freed at a later call once the grace period has passed
-- and it is still unreferenced, so that a sampler that drew an item just before it left
-- still finds its chunks when it reads them; referenced again, it is unmarked.
-- @include common
-- @keys 6..
-- @retry safe
-- KEYS[1] the store's meta  KEYS[1..6] its meta, chunks, refs, order, dead, tables
-- (StepKeys.all_keys())
-- KEYS[7..] the items hash of each buffer of the registry, by index (1, 2, ...)
-- ARGV[1] how many buffers the caller passed  ARGV[2] k, chunks per kind of candidate
-- ARGV[3] the grace period (ms)
-- Returns {examined, freed, chunks held, chunks marked}, or {-1, registered buffers}
-- when the registry holds another number of buffers (the caller reads it and calls again).
local S = {meta = KEYS[1], chunks = KEYS[2], refs = KEYS[3], order = KEYS[4],
  dead = KEYS[5]}
local T, k, grace = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local registered = tonumber(redis.call('HGET', S.meta, 'tables')) or 0
if registered ~= T or #KEYS ~= 6 + T then return {-1, registered} end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)

local candidates, seen = {}, {}
local function take(list)
  for _, chunk in ipairs(list) do
    if not seen[chunk] then
      seen[chunk] = true
      candidates[#candidates + 1] = chunk
    end
  end
end
take(redis.call('ZRANGE', S.order, 0, k - 1))
local cursor = tonumber(redis.call('HGET', S.meta, 'sweep_cursor')) or 0
local after = redis.call('ZRANGEBYSCORE', S.order, '(' .. cursor, '+inf', 'WITHSCORES',
  'LIMIT', 0, k)
local next_cursor = 0
for j = 1, #after, 2 do take({after[j]}) end
if #after == 2 * k then next_cursor = tonumber(after[#after]) end
redis.call('HSET', S.meta, 'sweep_cursor', next_cursor)
take(redis.call('ZRANGEBYSCORE', S.dead, '-inf', now_ms - grace, 'LIMIT', 0, k))

local freed = 0
for _, chunk in ipairs(candidates) do
  local text = redis.call('HGET', S.refs, chunk) or ''
  local words = {}
  for word in string.gmatch(text, '%S+') do words[#words + 1] = word end
  local alive = false
  for j = #words, 1, -1 do
    local index, id = string.match(words[j], '^(%d+):(%d+)$')
    local key = index and KEYS[6 + tonumber(index)]
    if key and redis.call('HEXISTS', key, id) == 1 then
      alive = true
      break
    end
  end
  if alive then
    redis.call('ZREM', S.dead, chunk)
  else
    local since = tonumber(redis.call('ZSCORE', S.dead, chunk))
    if since == nil then
      redis.call('ZADD', S.dead, now_ms, chunk)
    elseif now_ms - since >= grace then
      redis.call('HDEL', S.chunks, chunk)
      redis.call('HDEL', S.refs, chunk)
      redis.call('ZREM', S.order, chunk)
      redis.call('ZREM', S.dead, chunk)
      freed = freed + 1
    end
  end
end
if freed > 0 then redis.call('HINCRBY', S.meta, 'chunks_freed', freed) end
return {#candidates, freed, redis.call('ZCARD', S.order), redis.call('ZCARD', S.dead)}
