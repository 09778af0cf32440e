-- Free the chunks of a step store (redisbuf/buffers/steps.py) that no item references
-- any longer, a bounded number of chunks a call: those after the sweep's front (the
-- oldest chunks not yet found unreferenced) up to the first one still referenced, the
-- ones after its cursor (which cycles through every chunk) and those found unreferenced
-- at least a grace period ago. A chunk is referenced while one of the items its refs name
-- ("I:ID", the newest first) is in buffer I's items hash. One found unreferenced is
-- marked (dead: server ms) and freed at a later call once the grace period has passed
-- and it is still unreferenced, so that a sampler that drew an item just before it left
-- still finds its chunks when it reads them; referenced again, it is unmarked.
-- The front moves past each chunk it finds unreferenced and stops at a referenced one:
-- chunks mostly leave oldest first (FIFO removal), so each is looked at there once,
-- where the oldest k of every call were looked at again and again while they were
-- referenced, or marked and waiting out their grace period. A chunk left behind the
-- front (referenced again, or one that stays referenced while newer ones leave) is the
-- cursor's to find.
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

local seen, examined, freed = {}, 0, 0
-- how many chunks are marked: none (the common case while nothing leaves) spares every
-- referenced chunk's unmarking
local marked = redis.call('ZCARD', S.dead)

-- refs read ahead (one HMGET for the cursor's chunks), by chunk; false: none
local prefetched = {}

local function alive_word(word)
  local index, id = string.match(word, '^(%d+):(%d+)$')
  local key = index and KEYS[6 + tonumber(index)]
  return key ~= nil and redis.call('HEXISTS', key, id) == 1
end

-- whether an item chunk's refs name is still in its buffer
local function referenced(chunk)
  local text = prefetched[chunk]
  if text == nil then text = redis.call('HGET', S.refs, chunk) end
  if not text then return false end
  -- the newest first, alone: it leaves last under FIFO removal, the common case
  -- (anchored: an unanchored match would try every start of the text)
  local newest = string.match(text, '^.*%s(%S+)%s*$') or string.match(text, '^%s*(%S+)')
  if newest and alive_word(newest) then return true end
  local words = {}
  for word in string.gmatch(text, '%S+') do words[#words + 1] = word end
  for j = #words - 1, 1, -1 do
    if alive_word(words[j]) then return true end
  end
  return false
end

-- look at a chunk once a call: unmark it if referenced, else mark it or, marked a grace
-- period ago, free it; returns whether it is referenced
local function examine(chunk)
  if seen[chunk] ~= nil then return seen[chunk] end
  examined = examined + 1
  local alive = referenced(chunk)
  seen[chunk] = alive
  if alive then
    if marked > 0 then marked = marked - redis.call('ZREM', S.dead, chunk) end
  else
    local since = marked > 0 and tonumber(redis.call('ZSCORE', S.dead, chunk)) or nil
    if since == nil then
      redis.call('ZADD', S.dead, now_ms, chunk)
      marked = marked + 1
    elseif now_ms - since >= grace then
      redis.call('HDEL', S.chunks, chunk)
      redis.call('HDEL', S.refs, chunk)
      redis.call('ZREM', S.order, chunk)
      marked = marked - redis.call('ZREM', S.dead, chunk)
      freed = freed + 1
    end
  end
  return alive
end

local front = tonumber(redis.call('HGET', S.meta, 'sweep_front')) or 0
local oldest = redis.call('ZRANGEBYSCORE', S.order, '(' .. front, '+inf', 'WITHSCORES',
  'LIMIT', 0, k)
for j = 1, #oldest, 2 do
  if examine(oldest[j]) then break end
  front = tonumber(oldest[j + 1])
end
redis.call('HSET', S.meta, 'sweep_front', front)

local cursor = tonumber(redis.call('HGET', S.meta, 'sweep_cursor')) or 0
local after = redis.call('ZRANGEBYSCORE', S.order, '(' .. cursor, '+inf', 'WITHSCORES',
  'LIMIT', 0, k)
local unseen = {}
for j = 1, #after, 2 do
  if seen[after[j]] == nil then unseen[#unseen + 1] = after[j] end
end
if #unseen > 0 then
  local texts = hmget_chunked(S.refs, unseen)
  for i, chunk in ipairs(unseen) do prefetched[chunk] = texts[i] or false end
end
for j = 1, #after, 2 do examine(after[j]) end
redis.call('HSET', S.meta, 'sweep_cursor', #after == 2 * k and after[#after] or 0)

for _, chunk in ipairs(redis.call('ZRANGEBYSCORE', S.dead, '-inf', now_ms - grace,
    'LIMIT', 0, k)) do
  examine(chunk)
end
if freed > 0 then redis.call('HINCRBY', S.meta, 'chunks_freed', freed) end
return {examined, freed, redis.call('ZCARD', S.order), redis.call('ZCARD', S.dead)}
