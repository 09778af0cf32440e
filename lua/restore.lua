-- Swap a restore's staged content in place of a buffer's, atomically: readers see the
-- old buffer or the restored one, never a part. Counters are derived here.
-- @include common
-- @include masslog
-- @include items
-- KEYS[1] meta  KEYS[1..m] the buffer's keys (BufferKeys.all_keys(), meta first)
-- KEYS[m+1..2m] the staged keys in the same order (StagingKeys.all_keys()), filled by add.lua
--   and restore_items.lua
-- ARGV[1] inserted count from the file (an integer >= 0; raised to the length if below)
-- ARGV[2] sampled count from the file  ARGV[3] schema JSON, or "" to keep the buffer's
-- ARGV[4] "1" when the staged items carry PER priorities, else "0"
-- ARGV[5] the largest staged use count (0 when none)
-- Every data key of the buffer is replaced by its staged twin (deleted if there is none);
-- meta keeps its configuration and gets inserted, evicted = inserted - length, sampled,
-- and last_id = the larger of both (ids are never reused), present_uses = the sum of the
-- staged use counts. Under PER (meta tree_mass = per) items without a staged priority get
-- per_initial (the new-item rule, nothing else being present), the PER sum and non-zero
-- count are recomputed; with prioritized sampling (or PER) the mass log starts a new
-- epoch, so every sampler's replica reads the restored content. The staged keys are gone afterwards.
-- Returns the new length. Errors (checked before any write): RB_NOBUF (the buffer was
-- dropped), RB_CONFIG (the staged keys are missing or were made for another capacity;
-- staged PER priorities for a buffer without PER; a use count at or over max_use).
local m = #KEYS / 2
local meta, staged_meta = KEYS[1], KEYS[m + 1]
local conf = redis.call('HMGET', meta, 'capacity', 'last_id', 'tree', 'tree_mass', 'max_use',
  'per_initial')
if not conf[1] then return fail('RB_NOBUF', 'buffer meta ' .. meta .. ' does not exist') end
local staged = redis.call('HMGET', staged_meta, 'capacity', 'last_id')
if staged[1] ~= conf[1] then
  return fail('RB_CONFIG', 'staged restore ' .. staged_meta .. ' is missing or does not fit')
end
local per = conf[4] == 'per'
if ARGV[4] == '1' and not per then
  return fail('RB_CONFIG', 'the saved items carry PER priorities and buffer ' .. meta
    .. ' does not use PER (PERSampler)')
end
if conf[5] and tonumber(ARGV[5]) >= tonumber(conf[5]) then
  return fail('RB_CONFIG', 'a saved item was sampled ' .. ARGV[5] .. ' times, at or over'
    .. ' max_use=' .. conf[5] .. ' of buffer ' .. meta)
end
for i = 2, m do
  if redis.call('EXISTS', KEYS[m + i]) == 1 then
    redis.call('RENAME', KEYS[m + i], KEYS[i])
  else
    redis.call('DEL', KEYS[i])
  end
end
redis.call('DEL', staged_meta)
local K = buffer_keys(KEYS)
local length = redis.call('ZCARD', K.order)
local inserted = math.max(tonumber(ARGV[1]), length)
local last = math.max(tonumber(conf[2] or '0'), tonumber(staged[2] or '0'))
local used = 0
local counts = redis.call('HVALS', K.uses)
for i = 1, #counts do used = used + tonumber(counts[i]) end
redis.call('HSET', meta, 'inserted', string.format('%.0f', inserted),
  'evicted', string.format('%.0f', inserted - length), 'sampled', ARGV[2],
  'last_id', string.format('%.0f', last),
  'present_uses', string.format('%.0f', used))
redis.call('HDEL', meta, 'per_sum', 'per_comp', 'per_nonzero', 'per_max', 'per_heap')
if ARGV[3] ~= '' then
  redis.call('HSET', meta, 'schema', ARGV[3], 'kind', cjson.decode(ARGV[3])['kind'], 'rewards',
    schema_rewards(ARGV[3]))
end
if per then
  if redis.call('HLEN', K.per) ~= length then  -- not every item has a saved priority
    local present, missing = redis.call('ZRANGE', K.order, 0, -1), {}
    local scores = per_texts(K, present)
    for i = 1, #present do
      if not scores[i] then
        missing[#missing + 1] = present[i]
        missing[#missing + 1] = conf[6] or '1'
      end
    end
    call_chunked('HSET', K.per, missing)
  end
  local values, top = {}, 0
  local entries = redis.call('HVALS', K.per)
  for i = 1, #entries do
    values[i] = tonumber(entries[i])
    if values[i] > top then top = values[i] end
  end
  per_account(K, {}, values)
  if #values > 0 then per_raise_max(K, top) end
end
if per or conf[3] == '1' then  -- every replica reads the restored content
  redis.call('HSET', meta, 'tree', '1')
  masslog_reset(K)
end
return length
