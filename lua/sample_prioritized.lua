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
-- ARGV[4] n uniforms in [0, 1), packed 6 bytes each (see uniform_at)
-- With replacement each draw walks the sum tree from the root (tree_walk): O(log capacity)
-- per draw, all draws advancing together so each tree level costs one HMGET.
-- Without replacement the draws are successive: each walks the tree, then its leaf's mass
-- is removed from a script-local copy of the chunks on its path (recomputed as exact sums,
-- so a drawn item has mass 0 and is never drawn again); nothing is written back, and the
-- order of the ids is the order of the draws. O(n log capacity).
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
if #ARGV[4] ~= 6 * n then return fail('RB_INVALID', 'expected ' .. n .. ' packed uniforms') end
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

local function table_entry(masses, k) return masses[k] end

local function parse_chunk(chunk)
  local masses = {}
  for k = 0, FANOUT - 1 do masses[k] = chunk and chunk_entry(chunk, k) or 0 end
  return masses
end

local function masses_sum(masses)
  local sum = 0
  for k = 0, FANOUT - 1 do sum = sum + masses[k] end
  return sum
end

local slots, probabilities = {}, {}
if replace then
  local masses
  slots, masses = tree_walk(tree, depth, ARGV[4], n, total)
  for i = 1, n do probabilities[i] = masses[i] / total end
else
  local copy = {}  -- node -> its chunk's masses, as changed by this call's draws
  local function chunk_masses(node)
    if copy[node] == nil then copy[node] = parse_chunk(redis.call('HGET', tree, node)) end
    return copy[node]
  end
  local remaining, leaf0 = total, first_leaf(depth)
  for i = 1, n do
    if remaining <= 0 then
      return fail('RB_UNDEFINED', 'only ' .. (i - 1) .. ' item(s) have nonzero probability, '
        .. 'fewer than the ' .. n .. ' draws asked without replacement; draw fewer or '
        .. 'pass replacement=True')
    end
    local node, target, mass, path = 0, uniform_at(ARGV[4], i) * remaining, 0, {}
    for level = 1, depth do
      local chosen
      path[level] = node
      chosen, mass, target = chunk_child(table_entry, chunk_masses(node), target)
      node = FANOUT * node + 1 + chosen
    end
    slots[i] = node - leaf0
    probabilities[i] = mass / remaining
    -- remove the drawn mass: zero the leaf, then each ancestor's entry becomes the exact
    -- sum of its chunk (as tree_set_nodes writes it), so emptied subtrees hold exactly 0
    local child = node
    for level = depth, 1, -1 do
      local parent = path[level]
      local masses = copy[parent]
      local k = (child - 1) % FANOUT
      if level == depth then masses[k] = 0 else masses[k] = masses_sum(copy[child]) end
      child = parent
    end
    remaining = masses_sum(copy[0])
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
