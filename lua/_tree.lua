-- A sum tree in the server, pasted in place of "-- @include tree" (needs common); used by
-- SequenceBuffer's step priorities (lua/_seq.lua, the seq:tree key). The replay buffer's
-- prioritized sampling draws from replicas in the sampling processes instead
-- (lua/_masslog.lua, redisbuf/sampling/replica.py).
-- Layout: a 16-ary tree with 16^depth leaves (the smallest depth with 16^depth >= capacity).
-- Nodes are numbered as a heap: the root is node 0 and node v has children 16v+1..16v+16,
-- so the leaf of slot s is node FIRST_LEAF(depth) + s. The tree hash holds one field per
-- internal node v: a "chunk" of 16 fixed-width (24-character) numbers, the masses of v's
-- children. An absent chunk means 16 zeros. Sixteen children per chunk keep a 10^6-leaf
-- tree at 5 levels: each level costs one HMGET for all draws of a call.
local FANOUT = 16
local WIDTH = 24
local EMPTY_CHUNK = string.rep(string.format('%24d', 0), FANOUT)

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
