-- Draw items with probability proportional to exp(log_reward) (softmax), with replacement.
-- @include common
-- @include tree
-- @include items
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order (see
-- buffer_keys in _common.lua)
-- ARGV[1] n  ARGV[2] "1" = also return blobs
-- ARGV[3] n uniforms in [0, 1), packed 6 bytes each (see uniform_at)
-- Each draw walks the sum tree from the root: O(log capacity) per draw, all draws of one
-- call advancing together so each tree level costs one HMGET of the distinct chunks.
-- Returns {total, id_1..id_n, weight_1..weight_n} where weight_i / total is the
-- probability of drawing item i, and, if asked, {blob_1..blob_n} after them.
-- Errors: RB_NOTREE, RB_EMPTY, RB_INVALID.
local K = buffer_keys(KEYS)
local meta, items, tree, tree_ids = K.meta, K.items, K.tree, K.tree_ids
local conf = redis.call('HMGET', meta, 'tree', 'tree_depth')
if conf[1] ~= '1' then return fail('RB_NOTREE', 'prioritized sampling is not enabled') end
local depth = tonumber(conf[2])
local n = tonumber(ARGV[1])
if #ARGV[3] ~= 6 * n then return fail('RB_INVALID', 'expected ' .. n .. ' packed uniforms') end
local root = redis.call('HGET', tree, 0)
local total = root and chunk_sum(root) or 0
if total <= 0 then
  return fail('RB_EMPTY', 'buffer is empty (no item with a finite log-reward)')
end
local nodes, targets, weights = {}, {}, {}
for i = 1, n do
  nodes[i] = 0
  targets[i] = uniform_at(ARGV[3], i) * total
end
for _ = 1, depth do
  -- draws share nodes near the root: fetch each distinct chunk once
  local chunk_of, distinct = {}, {}
  for i = 1, n do
    if chunk_of[nodes[i]] == nil then
      chunk_of[nodes[i]] = #distinct + 1
      distinct[#distinct + 1] = nodes[i]
    end
  end
  local chunks = hmget_chunked(tree, distinct)
  for i = 1, n do
    local chunk = chunks[chunk_of[nodes[i]]] or EMPTY_CHUNK
    local target, chosen, mass = targets[i], nil, 0
    local last_k, last_mass = nil, 0
    for k = 0, FANOUT - 1 do
      mass = chunk_entry(chunk, k)
      if mass > 0 then
        if target < mass then
          chosen = k
          break
        end
        target = target - mass
        last_k, last_mass = k, mass
      end
    end
    if chosen == nil then  -- rounding pushed the target past the last child with mass
      chosen, mass, target = last_k, last_mass, last_mass * 0.5
    end
    nodes[i] = FANOUT * nodes[i] + 1 + chosen
    targets[i] = target
    weights[i] = mass
  end
end
local leaf0 = first_leaf(depth)
local slots = {}
for i = 1, n do slots[i] = nodes[i] - leaf0 end
local ids = hmget_chunked(tree_ids, slots)
local out = {fmt(total)}
for i = 1, n do out[1 + i] = ids[i] end
for i = 1, n do out[1 + n + i] = fmt(weights[i]) end
if ARGV[2] == '1' then
  local blobs = hmget_chunked(items, ids)
  for i = 1, n do out[1 + 2 * n + i] = blobs[i] end
end
record_draws(K, ids)  -- after the blobs: it may remove used-up items
return out
