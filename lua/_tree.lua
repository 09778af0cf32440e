-- Sum tree over item probability mass, pasted in place of "-- @include tree" (needs common).
-- Layout: a 16-ary tree with 16^depth leaves (the smallest depth with 16^depth >= capacity).
-- Nodes are numbered as a heap: the root is node 0 and node v has children 16v+1..16v+16,
-- so the leaf of slot s is node FIRST_LEAF(depth) + s. The tree hash holds one field per
-- internal node v: a "chunk" of 16 fixed-width (24-character) numbers, the masses of v's
-- children. An absent chunk means 16 zeros. The mass of a node is the sum of
-- exp(log_reward - ref) over the items below it; `ref` (meta field tree_ref) keeps exp() in
-- range: the tree is rebuilt around the current maximum when that drifts more than REBASE
-- nats from ref. Sixteen children per chunk keep a 10^6-item tree at 5 levels and ~70k
-- fields: each level costs one HMGET for all draws of a call. Items of log-reward +inf
-- have mass 0 here: a softmax over them is undefined, so sampling scripts refuse to draw
-- while any is present (see infinite_count) and the tree only has to stay consistent.
local REBASE = 300
-- meta tree_layout: the layout of the tree keys described here. A tree written by an
-- earlier version (one hash field per slot in tree:ids and tree:slots) has none and is
-- rebuilt by the next script that writes the tree.
local TREE_LAYOUT = '2'
local FANOUT = 16
local WIDTH = 24
local EMPTY_CHUNK = string.rep(string.format('%24d', 0), FANOUT)

local function leaf_weight(log_reward, ref)
  if log_reward == -math.huge or log_reward == math.huge then return 0 end
  return math.exp(log_reward - ref)
end

local function identity(x) return x end

-- Leaf masses follow one rule per buffer, chosen by the meta field tree_mass: absent means
-- exp(log_reward) from the prio zset (softmax); "per" means (priority + eps)^alpha from the
-- per zset (prioritized experience replay, meta per_alpha / per_eps). Both are kept as
-- exp(log_mass - ref), so they share ref and rebasing. Returns the log-mass function of a
-- source score and whether the rule is "per".
local function tree_mass_rule(meta_key)
  local conf = redis.call('HMGET', meta_key, 'tree_mass', 'per_alpha', 'per_eps')
  if conf[1] ~= 'per' then return identity, false end
  local alpha, eps = tonumber(conf[2]), tonumber(conf[3])
  return function(p)
    local base = p + eps
    if base <= 0 then return -math.huge end
    return alpha * math.log(base)
  end, true
end

local function tree_depth(capacity)
  local depth, leaves = 1, FANOUT
  while leaves < capacity do
    depth = depth + 1
    leaves = leaves * FANOUT
  end
  return depth
end

-- The first node of level `depth` = the number of nodes above it, 1 + 16 + ... + 16^(depth-1)
-- (integer arithmetic: Lua 5.4 would print a float node number as "4369.0").
local function first_leaf(depth)
  local count, width = 0, 1
  for _ = 1, depth do
    count = count + width
    width = width * FANOUT
  end
  return count
end

local function chunk_entry(chunk, k)
  return tonumber(string.sub(chunk, k * WIDTH + 1, (k + 1) * WIDTH)) or 0
end

local function chunk_sum(chunk)
  local total = 0
  for k = 0, FANOUT - 1 do total = total + chunk_entry(chunk, k) end
  return total
end

local function entry_text(value)
  return string.format('%24.17g', value)
end

-- A node whose mass falls below CANCEL times its old mass is re-summed from its chunk
-- rather than updated by its children's change: a subtree that empties holds exactly 0,
-- and one update adds at most about 1e-13 relative rounding error to a node.
local CANCEL = 1e-3

-- Set node masses (list of {node, value}; a later entry for the same node wins, as when an
-- evicted item's slot is reused in the same call) and update every ancestor, one level at
-- a time: each level costs one HMGET and one HSET however many nodes changed. An
-- ancestor's entry moves by the sum of its children's changes (reading one entry, not
-- sixteen), unless that cancels most of it (see CANCEL).
local function tree_set_nodes(tree_key, updates)
  local pending, order = {}, {}
  for _, update in ipairs(updates) do
    if pending[update[1]] == nil then order[#order + 1] = update[1] end
    pending[update[1]] = update[2]
  end
  local absolute = true  -- pending holds new masses (leaves), then changes of mass (above)
  local written = {}     -- node -> its chunk as written by the level below
  while #order > 0 and order[1] ~= 0 do
    -- group the changed nodes by the chunk (parent) holding their masses
    local parents, parent_list = {}, {}
    for _, node in ipairs(order) do
      local parent = math.floor((node - 1) / FANOUT)
      if parents[parent] == nil then
        parents[parent] = {}
        parent_list[#parent_list + 1] = parent
      end
      parents[parent][#parents[parent] + 1] = node
    end
    local chunks = hmget_chunked(tree_key, parent_list)
    local set_pairs, del_fields = {}, {}
    local next_pending, next_written = {}, {}
    for i, parent in ipairs(parent_list) do
      local chunk = chunks[i] or EMPTY_CHUNK
      local children = parents[parent]
      local parts
      if #children > 2 then  -- many changes: split once, join once
        parts = {}
        for k = 0, FANOUT - 1 do
          parts[k + 1] = string.sub(chunk, k * WIDTH + 1, (k + 1) * WIDTH)
        end
      end
      local change = 0
      for _, node in ipairs(children) do
        local k = (node - 1) % FANOUT
        local old
        if parts then old = tonumber(parts[k + 1]) or 0 else old = chunk_entry(chunk, k) end
        local new
        if absolute then
          new = pending[node]
        else
          new = old + pending[node]
          if new < old * CANCEL then new = chunk_sum(written[node]) end
        end
        change = change + (new - old)
        if parts then
          parts[k + 1] = entry_text(new)
        else
          chunk = string.sub(chunk, 1, k * WIDTH) .. entry_text(new)
            .. string.sub(chunk, (k + 1) * WIDTH + 1)
        end
      end
      if parts then chunk = table.concat(parts) end
      if chunk ~= EMPTY_CHUNK then
        set_pairs[#set_pairs + 1] = parent
        set_pairs[#set_pairs + 1] = chunk
      else
        del_fields[#del_fields + 1] = parent
      end
      next_pending[parent] = change
      next_written[parent] = chunk
    end
    call_chunked('HSET', tree_key, set_pairs)
    call_chunked('HDEL', tree_key, del_fields)
    pending, order, written, absolute = next_pending, parent_list, next_written, false
  end
end

-- tree:ids and tree:slots map leaf slots to item ids and back, each as small text buckets:
-- field b of tree:ids holds the ids of slots 16b..16b+15 (12 characters each), field b of
-- tree:slots the slots of ids 16b..16b+15 (SLOT_WIDTH characters each), blanks where there
-- is none. One hash entry per 16 items costs a fraction of one entry per item, and
-- consecutive ids (a batch, a FIFO eviction) share buckets: one lookup per 16 evicted
-- items rather than one cache miss each in a hash of millions of fields.
local BUCKET = 16
local ID_WIDTH = 12
local SLOT_WIDTH = 10
local BLANK_IDS = string.rep(' ', BUCKET * ID_WIDTH)
local BLANK_SLOTS = string.rep(' ', BUCKET * SLOT_WIDTH)

local function slot_text(slot)
  return string.format('%10d', tonumber(slot))
end

-- Group members (integers) by bucket: the distinct buckets in first-seen order and, for
-- each member, the position of its bucket in that list.
local function bucket_group(members)
  local index, fields, where = {}, {}, {}
  for i = 1, #members do
    local b = math.floor(members[i] / BUCKET)
    if index[b] == nil then
      fields[#fields + 1] = b
      index[b] = #fields
    end
    where[i] = index[b]
  end
  return fields, where
end

-- The entries of members (integers) in a bucket map of entry width `width`: their text,
-- or false where blank.
local function bucket_read(key, width, members)
  local fields, where = bucket_group(members)
  local got = hmget_chunked(key, fields)
  local out = {}
  for i = 1, #members do
    local bucket, value = got[where[i]], false
    if bucket then
      local k = members[i] % BUCKET
      local text = string.sub(bucket, k * width + 1, (k + 1) * width)
      if string.byte(text, width) ~= 32 then value = text end
    end
    out[i] = value
  end
  return out
end

-- Write entries of a bucket map: texts[i] (exactly `width` characters) or false (blank)
-- for members[i]; a later entry for the same member wins. A bucket left all blank is
-- deleted. `blank` is an all-blank bucket of this width.
local function bucket_write(key, width, blank, members, texts)
  if #members == 0 then return end
  local fields, where = bucket_group(members)
  local got = hmget_chunked(key, fields)
  local parts = {}
  for j = 1, #fields do
    local bucket, split = got[j] or blank, {}
    for k = 0, BUCKET - 1 do split[k + 1] = string.sub(bucket, k * width + 1, (k + 1) * width) end
    parts[j] = split
  end
  local empty = string.rep(' ', width)
  for i = 1, #members do
    parts[where[i]][members[i] % BUCKET + 1] = texts[i] or empty
  end
  local set_pairs, del_fields = {}, {}
  for j = 1, #fields do
    local bucket = table.concat(parts[j])
    if bucket == blank then
      del_fields[#del_fields + 1] = fields[j]
    else
      set_pairs[#set_pairs + 1] = fields[j]
      set_pairs[#set_pairs + 1] = bucket
    end
  end
  call_chunked('HSET', key, set_pairs)
  call_chunked('HDEL', key, del_fields)
end

-- The slots (numbers) of item ids (12-digit text); false for ids without one.
local function tree_slots_of(slots_key, ids)
  local members = {}
  for i = 1, #ids do members[i] = tonumber(ids[i]) end
  local out = bucket_read(slots_key, SLOT_WIDTH, members)
  for i = 1, #out do out[i] = out[i] and tonumber(out[i]) end
  return out
end

-- The item ids (12-digit text) in leaf slots (numbers); false for a free slot.
local function tree_ids_of(ids_key, slots)
  return bucket_read(ids_key, ID_WIDTH, slots)
end

-- Record slot -> id (ids[i], or false to free the slot) in tree:ids.
local function tree_set_ids(ids_key, slots, ids)
  local members = {}
  for i = 1, #slots do members[i] = tonumber(slots[i]) end
  bucket_write(ids_key, ID_WIDTH, BLANK_IDS, members, ids)
end

-- Record id -> slot (slots[i], a number, or false: no slot) in tree:slots.
local function tree_set_slots(slots_key, ids, slots)
  local members, texts = {}, {}
  for i = 1, #ids do
    members[i] = tonumber(ids[i])
    texts[i] = slots[i] and slot_text(slots[i])
  end
  bucket_write(slots_key, SLOT_WIDTH, BLANK_SLOTS, members, texts)
end

-- Build the tree from scratch from the priority zset: slots 0..n-1 in id order,
-- ref = the largest finite priority. O(n); runs on enable and on rebase only.
local function tree_rebuild(meta_key, prio_key, tree_key, ids_key, slots_key, free_key, capacity)
  redis.call('DEL', tree_key, ids_key, slots_key, free_key)
  local depth = tree_depth(capacity)
  local entries = redis.call('ZRANGE', prio_key, 0, -1, 'WITHSCORES')
  local log_mass = tree_mass_rule(meta_key)
  local ref = 0
  for i = #entries, 2, -2 do
    local raw = to_number(entries[i])
    if raw > -math.huge and raw < math.huge then
      local score = log_mass(raw)
      if score > -math.huge then ref = score end
      break
    end
  end
  local count = #entries / 2
  -- slots in id order, so that items added together (and evicted together under FIFO)
  -- share leaf chunks and buckets: a counting pass over the id range when it is dense,
  -- a sort otherwise
  local by_id, low, high = {}, math.huge, -math.huge
  for i = 1, count do
    local id = tonumber(entries[2 * i - 1])
    by_id[id] = i
    if id < low then low = id end
    if id > high then high = id end
  end
  local in_order = {}
  if count > 0 and high - low < 4 * count + 1024 then
    for id = low, high do
      if by_id[id] then in_order[#in_order + 1] = by_id[id] end
    end
  else
    for i = 1, count do in_order[i] = i end
    table.sort(in_order, function(a, b) return entries[2 * a - 1] < entries[2 * b - 1] end)
  end
  by_id = nil
  -- masses of the current level's nodes, by offset from the level's first node
  local masses = {}
  local id_parts, slot_parts = {}, {}  -- bucket -> {k -> text}
  for slot = 0, count - 1 do
    local i = in_order[slot + 1]
    local id = entries[2 * i - 1]
    masses[slot] = leaf_weight(log_mass(to_number(entries[2 * i])), ref)
    local b = math.floor(slot / BUCKET)
    if id_parts[b] == nil then id_parts[b] = {} end
    id_parts[b][slot % BUCKET] = id
    local number = tonumber(id)
    b = math.floor(number / BUCKET)
    if slot_parts[b] == nil then slot_parts[b] = {} end
    slot_parts[b][number % BUCKET] = slot_text(slot)
  end
  for _, map in ipairs({{ids_key, id_parts, ID_WIDTH}, {slots_key, slot_parts, SLOT_WIDTH}}) do
    local bucket_pairs, empty = {}, string.rep(' ', map[3])
    for b, texts in pairs(map[2]) do
      local parts = {}
      for k = 0, BUCKET - 1 do parts[k + 1] = texts[k] or empty end
      bucket_pairs[#bucket_pairs + 1] = b
      bucket_pairs[#bucket_pairs + 1] = table.concat(parts)
    end
    call_chunked('HSET', map[1], bucket_pairs)
  end
  local chunk_pairs = {}
  local width = count  -- nodes of this level that may be non-zero
  for level = depth, 1, -1 do
    local parent_first = first_leaf(level - 1)
    local parent_masses = {}
    local parents = math.ceil(width / FANOUT)
    for p = 0, parents - 1 do
      local parts, total = {}, 0
      for k = 0, FANOUT - 1 do
        local value = masses[p * FANOUT + k] or 0
        parts[k + 1] = entry_text(value)
        total = total + value
      end
      if total > 0 then
        chunk_pairs[#chunk_pairs + 1] = parent_first + p
        chunk_pairs[#chunk_pairs + 1] = table.concat(parts)
      end
      parent_masses[p] = total
    end
    masses, width = parent_masses, parents
  end
  call_chunked('HSET', tree_key, chunk_pairs)
  redis.call('HSET', meta_key, 'tree', 1, 'tree_depth', depth, 'tree_ref', fmt(ref),
    'tree_next_slot', count, 'tree_layout', TREE_LAYOUT)
end

-- The number of items of priority +inf (O(log n)).
local function infinite_count(prio_key)
  return redis.call('ZCOUNT', prio_key, '+inf', '+inf')
end

-- The largest finite priority, or nil when there is none.
local function max_finite_priority(prio_key)
  local skip = infinite_count(prio_key)
  local top = redis.call('ZREVRANGE', prio_key, skip, skip, 'WITHSCORES')
  if #top == 0 then return nil end
  local value = to_number(top[2])
  if value == -math.huge then return nil end
  return value
end

-- Whether the tree must be rebuilt: its maximum drifted past REBASE, or it has an earlier
-- layout (see TREE_LAYOUT).
local function tree_needs_rebase(meta_key, prio_key)
  if redis.call('HGET', meta_key, 'tree_layout') ~= TREE_LAYOUT then return true end
  local top = max_finite_priority(prio_key)
  if top == nil then return false end
  top = tree_mass_rule(meta_key)(top)
  if top == -math.huge then return false end
  local ref = tonumber(redis.call('HGET', meta_key, 'tree_ref'))
  return ref == nil or math.abs(top - ref) > REBASE
end

-- Keep the tree in step with items just removed (ids) and added (ids and their priorities
-- as text), after the other per-item structures were changed: free the removed items'
-- slots, give added ones a slot (freed slots first) and their mass, all in one pass up the
-- tree (a removed item's zero mass and an added item's mass on a reused slot are one
-- change: tree_set_nodes keeps the later). Rebuilds instead when the largest priority
-- drifted past REBASE from tree_ref. Under the PER rule the masses come from the per
-- zset, whatever added_priorities says.
local function tree_update(K, capacity, removed, added, added_priorities)
  local log_mass, per = tree_mass_rule(K.meta)
  local source = per and K.per or K.prio
  if per then
    added_priorities = zmscore_chunked(K.per, added)
    for i = 1, #added do added_priorities[i] = added_priorities[i] or '-inf' end
  end
  if tree_needs_rebase(K.meta, source) then
    tree_rebuild(K.meta, source, K.tree, K.tree_ids, K.tree_slots, K.tree_free, capacity)
    return
  end
  local leaf0 = first_leaf(tonumber(redis.call('HGET', K.meta, 'tree_depth')))
  local ref = tonumber(redis.call('HGET', K.meta, 'tree_ref'))
  local leaves, gone = {}, {}
  for _, id in ipairs(removed) do gone[id] = true end
  local kept = {}  -- positions in `added` of the items still present
  for i = 1, #added do
    if not gone[added[i]] then kept[#kept + 1] = i end
  end
  -- slots for the kept items: the removed items' slots first (reused in place, so the
  -- free list is not touched), then the free list (one LPOP with a count), then new
  -- slots past tree_next_slot (one HINCRBY)
  local new_slots, slot_ids, slot_list = {}, {}, {}
  local slot_id_members, slot_id_values = {}, {}
  if #removed > 0 then
    local slots = tree_slots_of(K.tree_slots, removed)
    local freed = {}
    for i, slot in ipairs(slots) do
      if slot then
        if #new_slots < #kept then
          new_slots[#new_slots + 1] = slot
        else
          freed[#freed + 1] = slot
          slot_list[#slot_list + 1] = slot
          slot_ids[#slot_list] = false
        end
        leaves[#leaves + 1] = {leaf0 + slot, 0}
        slot_id_members[#slot_id_members + 1] = removed[i]
        slot_id_values[#slot_id_members] = false
      end
    end
    call_chunked('RPUSH', K.tree_free, freed)
  end
  local short = #kept - #new_slots
  if short > 0 then
    local popped = redis.call('LPOP', K.tree_free, short) or {}
    for _, slot in ipairs(popped) do new_slots[#new_slots + 1] = tonumber(slot) end
    short = #kept - #new_slots
  end
  if short > 0 then
    local next_slot = redis.call('HINCRBY', K.meta, 'tree_next_slot', short) - short
    for j = 1, short do new_slots[#new_slots + 1] = next_slot + j - 1 end
  end
  for j, i in ipairs(kept) do
    local id, slot = added[i], new_slots[j]
    slot_list[#slot_list + 1] = slot
    slot_ids[#slot_list] = id
    slot_id_members[#slot_id_members + 1] = id
    slot_id_values[#slot_id_members] = slot
    leaves[#leaves + 1] = {leaf0 + slot, leaf_weight(log_mass(to_number(added_priorities[i])), ref)}
  end
  tree_set_ids(K.tree_ids, slot_list, slot_ids)
  tree_set_slots(K.tree_slots, slot_id_members, slot_id_values)
  tree_set_nodes(K.tree, leaves)
end

-- Set new masses of items already in the tree (their source zset was just written): ids
-- and their new scores (numbers). Rebuilds instead when the maximum drifted past REBASE.
local function tree_reweight(K, capacity, ids, scores)
  local log_mass, per = tree_mass_rule(K.meta)
  local source = per and K.per or K.prio
  if tree_needs_rebase(K.meta, source) then
    tree_rebuild(K.meta, source, K.tree, K.tree_ids, K.tree_slots, K.tree_free, capacity)
    return
  end
  local leaf0 = first_leaf(tonumber(redis.call('HGET', K.meta, 'tree_depth')))
  local ref = tonumber(redis.call('HGET', K.meta, 'tree_ref'))
  local slots = tree_slots_of(K.tree_slots, ids)
  local leaves = {}
  for i = 1, #ids do
    if slots[i] then
      leaves[#leaves + 1] = {leaf0 + slots[i], leaf_weight(log_mass(scores[i]), ref)}
    end
  end
  tree_set_nodes(K.tree, leaves)
end

-- Nil, or an error reply when the tree has an earlier layout (a sampling script cannot
-- rebuild it: the read-only variant must not write).
local function tree_layout_error(meta_key)
  if redis.call('HGET', meta_key, 'tree_layout') == TREE_LAYOUT then return nil end
  return fail('RB_NOTREE', 'the sum tree of ' .. meta_key .. ' has an earlier layout: it is '
    .. 'rebuilt by the next add or update_priority, or by reopening the buffer')
end

-- The mass of one leaf under the buffer's rule, for a score of its source zset.
local function tree_leaf_mass(meta_key, score)
  local ref = tonumber(redis.call('HGET', meta_key, 'tree_ref')) or 0
  return leaf_weight(tree_mass_rule(meta_key)(score), ref)
end

-- The child of a chunk that `target` falls in, reading masses through entry(chunk, k)
-- (k = 0..15): returns k, its mass and the target left inside it. Given `mass`, the chunk's
-- node's mass (its entry in the parent chunk, or the root chunk's sum), a target in the
-- upper half is found from the last child down: the same child (up to rounding at a child
-- boundary), reading about half as many entries on average (parsing them dominates a
-- descent's cost).
local function chunk_child(entry, chunk, target, mass)
  local last_k, last_mass = nil, 0
  if mass == nil or target < 0.5 * mass then
    for k = 0, FANOUT - 1 do
      local child = entry(chunk, k)
      if child > 0 then
        if target < child then return k, child, target end
        target = target - child
        last_k, last_mass = k, child
      end
    end
    -- rounding pushed the target past the last child with mass
    return last_k or 0, last_mass, last_mass * 0.5
  end
  local rest = mass - target
  for k = FANOUT - 1, 0, -1 do
    local child = entry(chunk, k)
    if child > 0 then
      if rest <= child then return k, child, child - rest end
      rest = rest - child
      last_k, last_mass = k, child
    end
  end
  -- rounding pushed the target before the first child with mass
  return last_k or 0, last_mass, last_mass * 0.5
end

-- A chunk's 16 masses as a table, [k + 1] = the mass of child k (made at its final size:
-- one allocation, no rehash as it fills).
local function tree_parse(text)
  local masses = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
  for k = 0, FANOUT - 1 do
    masses[k + 1] = tonumber(string.sub(text, k * WIDTH + 1, (k + 1) * WIDTH)) or 0
  end
  return masses
end

local function parsed_entry(masses, k) return masses[k + 1] end

-- Descend the tree for targets in [0, root mass) together: each level costs one HMGET of
-- the distinct chunks; a chunk that several draws pass through is parsed once (tree_parse),
-- one that a single draw or two pass through is read entry by entry, only as far as the
-- draw goes (chunk_child).
-- Returns the leaf slots reached and each leaf's mass.
local function tree_descend(tree_key, depth, targets)
  local n = #targets
  local nodes, masses = {}, {}
  for i = 1, n do nodes[i] = 0 end
  for level = 1, depth do
    local chunk_of, distinct, visits = {}, {}, {}
    for i = 1, n do
      local j = chunk_of[nodes[i]]
      if j == nil then
        j = #distinct + 1
        chunk_of[nodes[i]] = j
        distinct[j] = nodes[i]
        visits[j] = 0
      end
      visits[j] = visits[j] + 1
    end
    local chunks = hmget_chunked(tree_key, distinct)
    for j = 1, #distinct do
      local chunk = chunks[j] or EMPTY_CHUNK
      if visits[j] > 2 or level == 1 then chunk = tree_parse(chunk) end
      chunks[j] = chunk
    end
    if level == 1 and n > 0 then
      -- the root's mass: the sum of its chunk, in chunk_sum's order
      local root, total = chunks[1], 0
      for k = 1, FANOUT do total = total + root[k] end
      for i = 1, n do masses[i] = total end
    end
    for i = 1, n do
      local chunk = chunks[chunk_of[nodes[i]]]
      local entry = type(chunk) == 'string' and chunk_entry or parsed_entry
      local chosen, mass, target = chunk_child(entry, chunk, targets[i], masses[i])
      nodes[i] = FANOUT * nodes[i] + 1 + chosen
      targets[i] = target
      masses[i] = mass
    end
  end
  local leaf0 = first_leaf(depth)
  local slots = {}
  for i = 1, n do slots[i] = nodes[i] - leaf0 end
  return slots, masses
end

-- Walk n draws down the tree (uniforms packed as for uniform_at, total = the root's mass).
-- Returns the leaf slots drawn and each leaf's mass (a draw's probability is mass / total).
local function tree_walk(tree_key, depth, packed, n, total)
  local targets = {}
  for i = 1, n do targets[i] = uniform_at(packed, i) * total end
  return tree_descend(tree_key, depth, targets)
end
