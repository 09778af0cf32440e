-- Insert a batch and evict beyond capacity, atomically.
-- @include common
-- @include tree
-- @include items
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order (see
-- buffer_keys in _common.lua)
-- ARGV[1] schema (canonical JSON; set by the first add, must match afterwards)
-- ARGV[2] n, the number of items
-- ARGV[3] options: "" or a JSON object read by the parts that need more per batch
-- ARGV[4..] blob_1, log_reward_1, ..., blob_n, log_reward_n  (log-rewards as text, "-inf" ok)
-- Evicts (count - capacity) items: the oldest ("fifo"), or the lowest log-reward with the
-- oldest first among equals ("reward"). New items may be evicted at once under "reward".
-- Returns {first_id, n, evicted}, or {0, 0, 0, reason} when admit_batch (lua/_items.lua)
-- refuses a batch that is stale or from another session. Errors: RB_NOBUF, RB_SCHEMA,
-- RB_INVALID (a NaN, +inf or non-numeric priority; nothing is written).
local K = buffer_keys(KEYS)
local meta, prio, order = K.meta, K.prio, K.order
local conf = redis.call('HMGET', meta, 'capacity', 'eviction', 'schema', 'tree')
if not conf[1] then
  return fail('RB_NOBUF', 'buffer meta ' .. meta .. ' does not exist')
end
local capacity = tonumber(conf[1])
local n = tonumber(ARGV[2])
local options = {}
if ARGV[3] ~= '' then options = cjson.decode(ARGV[3]) end
-- check every priority before the first write: a script that fails halfway is not undone
for i = 1, n do
  local priority = to_number(ARGV[3 + 2 * i])
  if priority == nil or priority ~= priority or priority == math.huge then
    return fail('RB_INVALID', 'item ' .. (i - 1) .. ' has priority ' .. tostring(ARGV[3 + 2 * i])
      .. '; priorities must be numbers below +inf')
  end
end
if conf[3] and conf[3] ~= ARGV[1] then
  return fail('RB_SCHEMA', conf[3])
end
local refused = admit_batch(K, n, options)
if refused then return {0, 0, 0, refused} end
if not conf[3] then
  local kind = cjson.decode(ARGV[1])['kind']
  redis.call('HSET', meta, 'schema', ARGV[1], 'kind', kind)
end

local last = redis.call('HINCRBY', meta, 'last_id', n)
local first = last - n + 1
local new_ids, blobs, priorities = {}, {}, {}
for i = 1, n do
  new_ids[i] = id_str(first + i - 1)
  blobs[i] = ARGV[2 + 2 * i]
  priorities[i] = ARGV[3 + 2 * i]
end
store_items(K, new_ids, blobs, priorities, first, options)
redis.call('HINCRBY', meta, 'inserted', n)

local victims = {}
local excess = redis.call('ZCARD', order) - capacity
if excess > 0 then
  local source = order
  if conf[2] == 'reward' then source = prio end
  victims = redis.call('ZRANGE', source, 0, excess - 1)
  delete_items(K, victims)
  redis.call('HINCRBY', meta, 'evicted', #victims)
end
if conf[4] == '1' then
  tree_update(K, capacity, victims, new_ids, priorities)
end
return {first, n, #victims}
