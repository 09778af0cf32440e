-- Insert items that reference steps stored once (redisbuf/buffers/steps.py), into any
-- number of buffers in one step: the chunks a native HSET wrote into the store's chunks
-- hash just before this script (in the same MULTI/EXEC) are registered, each buffer's
-- items are stored and evicted as an add stores them (insert_batch in _insert.lua: its
-- remover, its PER priorities, the mass log), and every chunk an item references records
-- it (refs: "I:ID" words, I the buffer's index in the store's registry, ID the item's
-- id), which the sweep (lua/steps_sweep.lua) reads to free chunks no item references.
-- @include common
-- @include masslog
-- @include items
-- @include history
-- @include insert
-- @include admission
-- @keys 19..
-- @retry remembered
-- KEYS[1] the store's meta  KEYS[1..6] its meta, chunks, refs, order, dead, tables
-- (StepKeys.all_keys())
-- KEYS[7..] 13 keys of each buffer, in BufferKeys.all_keys() order, in ARGV's order
-- ARGV[1] T, the number of buffers  ARGV[2] C, the number of new chunks
-- ARGV[3..2+C] the new chunks' keys (their blobs already in the chunks hash)
-- then "admit" and the buffer of each item in the writer's order (indices 1..T, space
-- separated), or "" and "" (the caller admitted the items): with "admit", the buffers'
-- rate limiters admit the items one at a time in that order (lua/_admission.lua), the
-- items up to the first one not admitted are stored and counted (rl_inserts), the rest
-- are not (the caller sends them again)
-- then per buffer: its name, its schema (canonical JSON), n, options ("" or JSON, see
-- insert_batch), n flags ("1": the item is its episode's first in this buffer; the
-- stored ones are counted in the store's meta episodes:NAME), then n PER priorities (text; kept where the buffer has PER priorities
-- on), n item blobs, n reference lists (the chunk keys an item reads, space-separated)
-- Every check comes before any write: a buffer that does not exist (RB_NOBUF), another
-- schema (RB_SCHEMA), a bad PER priority (RB_INVALID, RB_CONFIG) or a referenced chunk
-- the store no longer holds (RB_GONE, naming them: the writer sends them again) refuses
-- the whole insert, and the new chunks' blobs are deleted (those not registered before).
-- Returns {items stored, the buffer (1..T) that held the next item back or 0, then
-- first_id, n, evicted of each buffer, back to back}.
local S = {meta = KEYS[1], chunks = KEYS[2], refs = KEYS[3], order = KEYS[4],
  dead = KEYS[5], tables = KEYS[6]}
local T, C = tonumber(ARGV[1]), tonumber(ARGV[2])
local new_chunks = {}
for i = 1, C do new_chunks[i] = ARGV[2 + i] end

local function refuse(reply)
  for _, chunk in ipairs(new_chunks) do
    if not redis.call('ZSCORE', S.order, chunk) then redis.call('HDEL', S.chunks, chunk) end
  end
  return reply
end

if #KEYS ~= 6 + 13 * T then
  return refuse(fail('RB_INVALID', 'steps_insert takes 6 + 13 keys per buffer, got '
    .. #KEYS .. ' for ' .. T .. ' buffers'))
end

local admit, order_text = ARGV[3 + C] == 'admit', ARGV[4 + C]
local batches, at = {}, 5 + C
for t = 1, T do
  local keys = {}
  for j = 1, 13 do keys[j] = KEYS[6 + 13 * (t - 1) + j] end
  local b = {K = buffer_keys(keys), name = ARGV[at], schema = ARGV[at + 1],
    n = tonumber(ARGV[at + 2]), options = batch_options(ARGV[at + 3]),
    flags = ARGV[at + 4]}
  at = at + 5
  local priorities, blobs, refs, zeros = {}, {}, {}, {}
  for i = 1, b.n do
    priorities[i] = ARGV[at + i - 1]
    blobs[i] = ARGV[at + b.n + i - 1]
    refs[i] = ARGV[at + 2 * b.n + i - 1]
    zeros[i] = '0'
  end
  at = at + 3 * b.n
  -- a buffer without PER priorities keeps none (its sampler does not read them)
  if per_enabled(b.K) then b.options.per_priorities = priorities end
  b.blobs, b.refs, b.zeros = blobs, refs, zeros
  local conf, err = buffer_config(b.K)
  if err then return refuse(err) end
  err = check_schema(conf, b.schema, nil)
  if err then return refuse(err) end
  local ok, problem = pcall(per_batch_priorities, b.K, b.n, b.options)
  if not ok then return refuse(redis.error_reply(tostring(problem))) end
  b.conf = conf
  batches[t] = b
end

-- the rate limiters' admission, an item at a time in the writer's order
local stored, held = 0, 0
for _, b in ipairs(batches) do stored = stored + b.n end
if admit then
  local granted, used, order = {}, {}, {}
  for t, b in ipairs(batches) do
    granted[t] = inserts_admitted(b.K.meta, b.K.order, b.n)
    used[t] = 0
  end
  for word in string.gmatch(order_text, '%d+') do order[#order + 1] = tonumber(word) end
  stored = 0
  for _, t in ipairs(order) do
    if used[t] >= granted[t] then held = t break end
    used[t] = used[t] + 1
    stored = stored + 1
  end
  for t, b in ipairs(batches) do  -- keep each buffer's admitted first items
    for i = used[t] + 1, b.n do
      b.blobs[i], b.refs[i], b.zeros[i] = nil, nil, nil
      if b.options.per_priorities then b.options.per_priorities[i] = nil end
    end
    b.n = used[t]
  end
end

if stored == 0 then return refuse({0, held}) end  -- nothing admitted: nothing written

-- every chunk referenced must be held (a sweep may have freed an old one)
local referenced, missing = {}, {}
for _, chunk in ipairs(new_chunks) do referenced[chunk] = true end  -- HSET just now
for _, b in ipairs(batches) do
  for i = 1, b.n do
    for chunk in string.gmatch(b.refs[i], '%S+') do
      if referenced[chunk] == nil then
        referenced[chunk] = redis.call('HEXISTS', S.chunks, chunk) == 1
        if not referenced[chunk] then missing[#missing + 1] = chunk end
      end
    end
  end
end
if #missing > 0 then
  return refuse(fail('RB_GONE', table.concat(missing, ' ')))
end

-- register the new chunks in the order, in one ZMSCORE and one ZADD (a writer of large
-- steps sends a chunk every few steps: calls per chunk were a third of the server's time)
local unregistered = {}  -- the new chunks the order did not hold (not sent before)
if C > 0 then
  local scores, fresh = zmscore_chunked(S.order, new_chunks), {}
  for i, chunk in ipairs(new_chunks) do
    if not scores[i] then
      fresh[#fresh + 1] = chunk
      unregistered[chunk] = true
    end
  end
  if #fresh > 0 then
    local seq = redis.call('HINCRBY', S.meta, 'seq', #fresh) - #fresh
    local scored = {}
    for i, chunk in ipairs(fresh) do
      scored[2 * i - 1], scored[2 * i] = seq + i, chunk
    end
    call_chunked('ZADD', S.order, scored)
  end
end

local reply, words = {stored, held}, {}
for t, b in ipairs(batches) do
  reply[3 * t], reply[3 * t + 1], reply[3 * t + 2] = 0, 0, 0
  if b.n > 0 then
    local index = redis.call('HGET', S.meta, 'table:' .. b.name)
    if not index then
      index = redis.call('HINCRBY', S.meta, 'tables', 1)
      redis.call('HSET', S.meta, 'table:' .. b.name, index, 'tname:' .. index, b.name)
    end
    if admit and redis.call('HEXISTS', b.K.meta, 'rl_spi') == 1 then
      redis.call('HINCRBY', b.K.meta, 'rl_inserts', b.n)
    end
    local result = insert_batch(b.K, b.conf, b.schema, b.options, b.blobs, b.zeros, nil)
    local _, episodes = string.gsub(string.sub(b.flags, 1, b.n), '1', '1')
    if episodes > 0 then redis.call('HINCRBY', S.meta, 'episodes:' .. b.name, episodes) end
    local first = tonumber(result[1])
    for i = 1, tonumber(result[2]) do
      local word = index .. ':' .. id_str(first + i - 1)
      for chunk in string.gmatch(b.refs[i], '%S+') do
        local list = words[chunk]
        if list == nil then
          list = {}
          words[chunk] = list
        end
        list[#list + 1] = word
      end
    end
    reply[3 * t], reply[3 * t + 1], reply[3 * t + 2] = result[1], result[2], result[3]
  end
end
-- each chunk's refs get the new items' words, after those it had: a chunk registered just
-- now has none (a freed chunk's refs and mark go with it), nor can it be marked
local older = {}
for chunk in pairs(words) do
  if not unregistered[chunk] then older[#older + 1] = chunk end
end
local befores = #older > 0 and hmget_chunked(S.refs, older) or {}
local before_of = {}
for i, chunk in ipairs(older) do before_of[chunk] = befores[i] end
local updates = {}
for chunk, list in pairs(words) do
  local text = table.concat(list, ' ')
  local before = before_of[chunk]
  if before then text = before .. ' ' .. text end
  updates[#updates + 1] = chunk
  updates[#updates + 1] = text
end
if #updates > 0 then call_chunked('HSET', S.refs, updates) end
if #older > 0 and redis.call('ZCARD', S.dead) > 0 then  -- referenced again: not to be freed
  call_chunked('ZREM', S.dead, older)
end
redis.call('HINCRBY', S.meta, 'chunks_written', C)
return reply
