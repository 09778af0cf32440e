-- Swap a restore's staged content in place of a buffer's, atomically: readers see the
-- old buffer or the restored one, never a part. Counters are derived here.
-- @include common
-- @include tree
-- KEYS[1] meta  KEYS[1..m] the buffer's keys (BufferKeys.all_keys(), meta first)
-- KEYS[m+1..2m] the staged keys in the same order (StagingKeys.all_keys()), filled by add.lua
-- ARGV[1] inserted count from the file (an integer >= 0; raised to the length if below)
-- ARGV[2] sampled count from the file  ARGV[3] schema JSON, or "" to keep the buffer's
-- Every data key of the buffer is replaced by its staged twin (deleted if there is none);
-- meta keeps its configuration and gets inserted, evicted = inserted - length, sampled,
-- and last_id = the larger of both (ids are never reused); the sum tree is rebuilt when
-- prioritized sampling is on. The staged keys are gone afterwards.
-- Returns the new length. Errors: RB_NOBUF (the buffer was dropped), RB_CONFIG (the
-- staged keys are missing or were made for another capacity).
local m = #KEYS / 2
local meta, staged_meta = KEYS[1], KEYS[m + 1]
local conf = redis.call('HMGET', meta, 'capacity', 'last_id', 'tree')
if not conf[1] then return fail('RB_NOBUF', 'buffer meta ' .. meta .. ' does not exist') end
local staged = redis.call('HMGET', staged_meta, 'capacity', 'last_id')
if staged[1] ~= conf[1] then
  return fail('RB_CONFIG', 'staged restore ' .. staged_meta .. ' is missing or does not fit')
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
redis.call('HSET', meta, 'inserted', string.format('%.0f', inserted),
  'evicted', string.format('%.0f', inserted - length), 'sampled', ARGV[2],
  'last_id', string.format('%.0f', last), 'tree_next_slot', 0)
redis.call('HDEL', meta, 'tree_ref')
if ARGV[3] ~= '' then
  redis.call('HSET', meta, 'schema', ARGV[3], 'kind', cjson.decode(ARGV[3])['kind'])
end
if conf[3] == '1' then
  tree_rebuild(meta, K.prio, K.tree, K.tree_ids, K.tree_slots, K.tree_free, tonumber(conf[1]))
end
return length
