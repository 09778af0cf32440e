-- Insert a batch and evict beyond capacity, atomically.
-- @include common
-- @include tree
-- KEYS[1] meta  KEYS[2] items  KEYS[3] prio  KEYS[4] order
-- KEYS[5] tree  KEYS[6] tree:ids  KEYS[7] tree:slots  KEYS[8] tree:free
-- ARGV[1] schema (canonical JSON; set by the first add, must match afterwards)
-- ARGV[2] n, the number of items
-- ARGV[3..] blob_1, log_reward_1, ..., blob_n, log_reward_n  (log-rewards as text, "-inf" ok)
-- Evicts (count - capacity) items: the oldest ("fifo"), or the lowest log-reward with the
-- oldest first among equals ("reward"). New items may be evicted at once under "reward".
-- Returns {first_id, n, evicted}. Errors: RB_NOBUF, RB_SCHEMA, RB_INVALID (a NaN, +inf or
-- non-numeric priority; nothing is written).
local meta, items, prio, order = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local conf = redis.call('HMGET', meta, 'capacity', 'eviction', 'schema', 'tree')
if not conf[1] then
  return fail('RB_NOBUF', 'buffer meta ' .. meta .. ' does not exist')
end
local capacity = tonumber(conf[1])
local n = tonumber(ARGV[2])
-- check every priority before the first write: a script that fails halfway is not undone
for i = 1, n do
  local priority = to_number(ARGV[2 + 2 * i])
  if priority == nil or priority ~= priority or priority == math.huge then
    return fail('RB_INVALID', 'item ' .. (i - 1) .. ' has priority ' .. tostring(ARGV[2 + 2 * i])
      .. '; priorities must be numbers below +inf')
  end
end
if not conf[3] then
  local kind = cjson.decode(ARGV[1])['kind']
  redis.call('HSET', meta, 'schema', ARGV[1], 'kind', kind)
elseif conf[3] ~= ARGV[1] then
  return fail('RB_SCHEMA', conf[3])
end

local last = redis.call('HINCRBY', meta, 'last_id', n)
local first = last - n + 1
local item_pairs, prio_pairs, order_pairs = {}, {}, {}
local new_ids = {}
for i = 1, n do
  local id = id_str(first + i - 1)
  new_ids[i] = id
  item_pairs[2 * i - 1] = id
  item_pairs[2 * i] = ARGV[1 + 2 * i]
  prio_pairs[2 * i - 1] = ARGV[2 + 2 * i]
  prio_pairs[2 * i] = id
  order_pairs[2 * i - 1] = first + i - 1
  order_pairs[2 * i] = id
end
call_chunked('HSET', items, item_pairs)
call_chunked('ZADD', prio, prio_pairs)
call_chunked('ZADD', order, order_pairs)
redis.call('HINCRBY', meta, 'inserted', n)

local victims = {}
local excess = redis.call('ZCARD', order) - capacity
if excess > 0 then
  local source = order
  if conf[2] == 'reward' then source = prio end
  victims = redis.call('ZRANGE', source, 0, excess - 1)
  call_chunked('HDEL', items, victims)
  call_chunked('ZREM', prio, victims)
  call_chunked('ZREM', order, victims)
  redis.call('HINCRBY', meta, 'evicted', #victims)
end

if conf[4] == '1' then
  local tree, tree_ids, tree_slots, tree_free = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
  if tree_needs_rebase(meta, prio) then
    tree_rebuild(meta, prio, tree, tree_ids, tree_slots, tree_free, capacity)
  else
    local leaf0 = first_leaf(tonumber(redis.call('HGET', meta, 'tree_depth')))
    local ref = tonumber(redis.call('HGET', meta, 'tree_ref'))
    local leaves, gone = {}, {}
    for _, id in ipairs(victims) do gone[id] = true end
    if #victims > 0 then
      local slots = hmget_chunked(tree_slots, victims)
      local freed = {}
      for _, slot in ipairs(slots) do
        if slot then
          freed[#freed + 1] = slot
          leaves[#leaves + 1] = {leaf0 + tonumber(slot), 0}
        end
      end
      call_chunked('HDEL', tree_slots, victims)
      call_chunked('HDEL', tree_ids, freed)
      call_chunked('RPUSH', tree_free, freed)
    end
    local id_pairs, slot_pairs = {}, {}
    for i = 1, n do
      local id = new_ids[i]
      if not gone[id] then
        local slot = redis.call('LPOP', tree_free)
        if not slot then
          slot = redis.call('HINCRBY', meta, 'tree_next_slot', 1) - 1
        end
        id_pairs[#id_pairs + 1] = slot
        id_pairs[#id_pairs + 1] = id
        slot_pairs[#slot_pairs + 1] = id
        slot_pairs[#slot_pairs + 1] = slot
        leaves[#leaves + 1] = {
          leaf0 + tonumber(slot), leaf_weight(to_number(ARGV[2 + 2 * i]), ref)
        }
      end
    end
    call_chunked('HSET', tree_ids, id_pairs)
    call_chunked('HSET', tree_slots, slot_pairs)
    tree_set_nodes(tree, leaves)
  end
end
return {first, n, #victims}
