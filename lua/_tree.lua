-- Sum tree over item probability mass, pasted in place of "-- @include tree" (needs common).
-- Layout: a perfect binary tree of `size` leaves (size = next power of two >= capacity),
-- node 1 is the root, node k has children 2k and 2k+1, leaf of slot s is node size+s.
-- A node's field in the tree hash holds the sum of exp(log_reward - ref) below it;
-- absent means 0. `ref` (meta field tree_ref) keeps exp() in range: the tree is rebuilt
-- around the current maximum when that drifts more than REBASE nats from ref.
local REBASE = 300

local function leaf_weight(log_reward, ref)
  if log_reward == -math.huge then return 0 end
  return math.exp(log_reward - ref)
end

-- Write leaf values (list of {node, value}; a later entry for the same node wins, as when
-- an evicted item's slot is reused in the same call) and recompute every ancestor, one
-- level at a time, so each level costs one HMGET and one HSET however many leaves changed.
local function tree_set_leaves(tree_key, leaves)
  local final, order = {}, {}
  for _, leaf in ipairs(leaves) do
    if final[leaf[1]] == nil then order[#order + 1] = leaf[1] end
    final[leaf[1]] = leaf[2]
  end
  local set_pairs, del_fields, dirty, dirty_list = {}, {}, {}, {}
  for _, node in ipairs(order) do
    if final[node] > 0 then
      set_pairs[#set_pairs + 1] = node
      set_pairs[#set_pairs + 1] = fmt(final[node])
    else
      del_fields[#del_fields + 1] = node
    end
    local parent = math.floor(node / 2)
    if parent >= 1 and not dirty[parent] then
      dirty[parent] = true
      dirty_list[#dirty_list + 1] = parent
    end
  end
  call_chunked('HSET', tree_key, set_pairs)
  call_chunked('HDEL', tree_key, del_fields)
  while #dirty_list > 0 do
    local children = {}
    for _, node in ipairs(dirty_list) do
      children[#children + 1] = 2 * node
      children[#children + 1] = 2 * node + 1
    end
    local values = hmget_chunked(tree_key, children)
    set_pairs, del_fields = {}, {}
    local next_dirty, next_list = {}, {}
    for i, node in ipairs(dirty_list) do
      local sum = (tonumber(values[2 * i - 1]) or 0) + (tonumber(values[2 * i]) or 0)
      if sum > 0 then
        set_pairs[#set_pairs + 1] = node
        set_pairs[#set_pairs + 1] = fmt(sum)
      else
        del_fields[#del_fields + 1] = node
      end
      local parent = math.floor(node / 2)
      if parent >= 1 and not next_dirty[parent] then
        next_dirty[parent] = true
        next_list[#next_list + 1] = parent
      end
    end
    call_chunked('HSET', tree_key, set_pairs)
    call_chunked('HDEL', tree_key, del_fields)
    dirty_list = next_list
  end
end

-- Build the tree from scratch from the priority zset: slots 0..n-1 in priority order,
-- ref = the largest finite priority. O(n); runs on enable and on rebase only.
local function tree_rebuild(meta_key, prio_key, tree_key, ids_key, slots_key, free_key, capacity)
  redis.call('DEL', tree_key, ids_key, slots_key, free_key)
  local size = 1
  while size < capacity do size = size * 2 end
  local entries = redis.call('ZRANGE', prio_key, 0, -1, 'WITHSCORES')
  local ref = 0
  for i = #entries, 2, -2 do
    local score = to_number(entries[i])
    if score > -math.huge then ref = score break end
  end
  local level, id_pairs, slot_pairs = {}, {}, {}
  local count = #entries / 2
  for i = 1, count do
    local slot = i - 1
    level[size + slot] = leaf_weight(to_number(entries[2 * i]), ref)
    id_pairs[#id_pairs + 1] = slot
    id_pairs[#id_pairs + 1] = entries[2 * i - 1]
    slot_pairs[#slot_pairs + 1] = entries[2 * i - 1]
    slot_pairs[#slot_pairs + 1] = slot
  end
  call_chunked('HSET', ids_key, id_pairs)
  call_chunked('HSET', slots_key, slot_pairs)
  local node_pairs = {}
  local lo, hi = size, size + count - 1
  while hi >= 1 and lo <= hi do
    local parent_level = {}
    for node = lo, hi do
      local value = level[node] or 0
      if value > 0 then
        node_pairs[#node_pairs + 1] = node
        node_pairs[#node_pairs + 1] = fmt(value)
      end
      if node > 1 then
        local parent = math.floor(node / 2)
        parent_level[parent] = (parent_level[parent] or 0) + value
      end
    end
    level = parent_level
    if lo == 1 then break end
    lo, hi = math.floor(lo / 2), math.floor(hi / 2)
  end
  call_chunked('HSET', tree_key, node_pairs)
  redis.call('HSET', meta_key, 'tree', 1, 'tree_size', size, 'tree_ref', fmt(ref),
    'tree_next_slot', count)
end

-- The largest finite priority, or nil when there is none.
local function max_finite_priority(prio_key)
  local top = redis.call('ZREVRANGE', prio_key, 0, 0, 'WITHSCORES')
  if #top == 0 then return nil end
  local value = to_number(top[2])
  if value == -math.huge then return nil end
  return value
end

local function tree_needs_rebase(meta_key, prio_key)
  local top = max_finite_priority(prio_key)
  if top == nil then return false end
  local ref = tonumber(redis.call('HGET', meta_key, 'tree_ref'))
  return ref == nil or math.abs(top - ref) > REBASE
end
