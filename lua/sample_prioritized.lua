-- Draw items with probability proportional to exp(log_reward) (softmax), with or without
-- replacement.
-- @include common
-- @include tree
-- @include items
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order (see
-- buffer_keys in _common.lua)
-- ARGV[1] n  ARGV[2] "1" = with replacement, "0" = without (with replacement anyway when
-- n exceeds the number of items, as torch.multinomial(..., replacement=n > len) in torchgfn)
-- ARGV[3] "1" = also return blobs
-- ARGV[4] uniforms in [0, 1), packed 6 bytes each (see uniform_at): at least n; draws
-- without replacement use more when given (the client sends 3n), the others the first n
-- With replacement each draw walks the sum tree from the root (tree_walk): O(log capacity)
-- per draw, all draws advancing together so each tree level costs one HMGET.
-- Without replacement the draws are successive, made in rounds: a round descends the tree
-- for a batch of draws together (one HMGET per level for the chunks not read yet, as with
-- replacement), over the mass of the items not drawn yet, and keeps each item's first
-- occurrence, in the order of the draws, until n items are drawn; a kept item's mass is
-- then removed from a script-local copy of the chunks on its path (each ancestor's entry
-- lowered by it, re-summed from its chunk where that cancels most of it, as
-- tree_set_nodes does, so a drawn item has mass 0 and is never drawn again; nothing is
-- written back). Keeping first occurrences of draws with replacement is exactly
-- successive drawing: each kept item is drawn from the items not kept yet in proportion
-- to their masses, whatever the batch sizes. The first round makes min(n, 64) draws, each
-- later one twice as many as the last one kept (a repeat costs a descent where the mass
-- is concentrated), never more than the items still wanted, nor more than the uniforms
-- left allow while keeping one per item still wanted (a round always keeps at least one
-- item: down to one draw a round, the plain successive draw). O(n log capacity) work and
-- O(log capacity) HMGETs a round; the order of the ids is the order of the draws.
-- Returns {total, id_1..id_n, p_1..p_n} where p_i is the probability with which draw i
-- picked its item (given the earlier draws, without replacement), and, if asked,
-- {blob_1..blob_n} after them.
-- Errors: RB_NOTREE (not on, or an earlier layout), RB_EMPTY, RB_INVALID, RB_UNDEFINED (an
-- item of log-reward +inf, or fewer items of nonzero probability than draws without
-- replacement).
local K = buffer_keys(KEYS)
local meta, items, tree, tree_ids = K.meta, K.items, K.tree, K.tree_ids
local conf = redis.call('HMGET', meta, 'tree', 'tree_depth')
if conf[1] ~= '1' then return fail('RB_NOTREE', 'prioritized sampling is not enabled') end
local layout_err = tree_layout_error(meta)
if layout_err then return layout_err end
local depth = tonumber(conf[2])
local n = tonumber(ARGV[1])
local uniforms = math.floor(#ARGV[4] / 6)
if 6 * uniforms ~= #ARGV[4] or uniforms < n then
  return fail('RB_INVALID', 'expected at least ' .. n .. ' packed uniforms')
end
local root = redis.call('HGET', tree, 0)
local total = root and chunk_sum(root) or 0
local infinite = infinite_count(K.prio)
if infinite > 0 then
  return fail('RB_UNDEFINED', infinite .. ' item(s) have log-reward +inf: the softmax of '
    .. 'log-rewards is undefined; sample uniformly or remove them')
end
if total <= 0 then
  return fail('RB_EMPTY', 'buffer is empty (no item with a finite log-reward)')
end
local replace = ARGV[2] == '1' or n > redis.call('ZCARD', K.order)
-- Draws in the first round without replacement: where every draw finds a new item, more
-- rounds cost a few HMGETs each; where the mass is concentrated, each repeat costs a descent
local FIRST_ROUND = 64

local slots, probabilities = {}, {}
if replace then
  local masses
  slots, masses = tree_walk(tree, depth, ARGV[4], n, total)
  for i = 1, n do probabilities[i] = masses[i] / total end
else
  local remaining = total  -- the mass of the items not drawn yet
  -- node -> its chunk as changed by this call's draws, {[k] = the mass of child k}: parsed
  -- entry by entry as read while raw holds the chunk's text, then whole (raw nil) once
  -- several draws pass through it (parsing dominates the cost, as in tree_descend)
  local copy = {}
  local sub, number = string.sub, tonumber
  local function entry(chunk, k)  -- chunk_entry, inlined
    local mass = chunk[k]
    if mass == nil then
      mass = number(sub(chunk.raw, k * WIDTH + 1, (k + 1) * WIDTH)) or 0
      chunk[k] = mass
    end
    return mass
  end
  local function whole(chunk)
    if chunk.raw then
      for k = 0, FANOUT - 1 do entry(chunk, k) end
      chunk.raw = nil
    end
    return chunk
  end
  local function chunk_total(chunk)
    whole(chunk)
    local sum = 0
    for k = 0, FANOUT - 1 do sum = sum + chunk[k] end
    return sum
  end
  local leaf0 = first_leaf(depth)
  -- the leaf nodes that draws for targets in [0, remaining mass) reach, and their masses,
  -- all draws advancing together: one HMGET per level for the chunks not in copy yet
  local function descend(targets)
    local nodes, masses = {}, {}
    for i = 1, #targets do
      nodes[i] = 0
      masses[i] = remaining
    end
    for _ = 1, depth do
      local missing, visits = {}, {}
      for i = 1, #targets do
        local node = nodes[i]
        if visits[node] == nil then
          visits[node] = 0
          if copy[node] == nil then missing[#missing + 1] = node end
        end
        visits[node] = visits[node] + 1
      end
      if #missing > 0 then
        local chunks = hmget_chunked(tree, missing)
        for j = 1, #missing do copy[missing[j]] = {raw = chunks[j] or EMPTY_CHUNK, visits = 0} end
      end
      for node, count in pairs(visits) do
        local chunk = copy[node]
        chunk.visits = chunk.visits + count
        if chunk.visits > 2 then whole(chunk) end
      end
      for i = 1, #targets do
        local chosen, mass, target = chunk_child(entry, copy[nodes[i]], targets[i], masses[i])
        nodes[i] = FANOUT * nodes[i] + 1 + chosen
        targets[i] = target
        masses[i] = mass
      end
    end
    return nodes, masses
  end
  -- remove a drawn leaf's mass: zero the leaf, then each ancestor's entry drops by its
  -- chunk's drop, or is re-summed from its chunk when that cancels most of it (CANCEL, as
  -- tree_set_nodes does), so emptied subtrees hold exactly 0; returns the mass left
  local function remove(node)
    local child = node
    local drop = 0
    for level = depth, 1, -1 do
      local parent = math.floor((child - 1) / FANOUT)
      local chunk, k = copy[parent], (child - 1) % FANOUT
      local old = entry(chunk, k)
      local new = 0
      if level < depth then
        new = old - drop
        if new < old * CANCEL then new = chunk_total(copy[child]) end
      end
      chunk[k] = new
      drop = old - new
      child = parent
    end
    return chunk_total(copy[0])
  end
  local drawn, count, used, batch = {}, 0, 0, math.min(n, FIRST_ROUND)
  while count < n do
    if remaining <= 0 then
      return fail('RB_UNDEFINED', 'only ' .. count .. ' item(s) have nonzero probability, '
        .. 'fewer than the ' .. n .. ' draws asked without replacement; draw fewer or '
        .. 'pass replacement=True')
    end
    -- every round finds at least one new item (its first draw: drawn items have mass 0),
    -- so keeping need - 1 uniforms for the rounds after this one always suffices
    local need = n - count
    batch = math.min(batch, need, uniforms - used - need + 1)
    if batch < 1 then  -- only if the tree's sums disagree with its chunks
      return fail('RB_INVALID', 'the sum tree of ' .. meta .. ' is inconsistent')
    end
    local targets = {}
    for j = 1, batch do targets[j] = uniform_at(ARGV[4], used + j) * remaining end
    used = used + batch
    local nodes, masses = descend(targets)
    local found = 0
    for j = 1, batch do
      local node = nodes[j]
      if not drawn[node] then
        drawn[node] = true
        count, found = count + 1, found + 1
        slots[count] = node - leaf0
        probabilities[count] = masses[j] / remaining
        remaining = remove(node)
        if count == n then break end
      end
    end
    batch = 2 * found
  end
end
local ids = tree_ids_of(tree_ids, slots)
local out = {fmt(total)}
for i = 1, n do out[1 + i] = ids[i] end
for i = 1, n do out[1 + n + i] = fmt(probabilities[i]) end
if ARGV[3] == '1' then
  local blobs = hmget_chunked(items, ids)
  for i = 1, n do out[1 + 2 * n + i] = blobs[i] end
end
record_draws(K, ids)  -- after the blobs: it may remove used-up items
return out
