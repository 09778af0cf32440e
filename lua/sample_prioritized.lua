-- Draw items with probability proportional to exp(log_reward) (softmax), with replacement.
-- @include common
-- KEYS[1] meta  KEYS[2] items  KEYS[3] tree  KEYS[4] tree:ids
-- ARGV[1] n  ARGV[2] "1" = also return blobs
-- ARGV[3] n uniforms in [0, 1), packed 6 bytes each (see uniform_at)
-- Each draw walks the sum tree from the root: O(log capacity) per draw, all draws of one
-- call advancing together so each tree level costs one HMGET of the distinct nodes.
-- Returns {total, id_1..id_n, weight_1..weight_n} where weight_i / total is the
-- probability of drawing item i, and, if asked, {blob_1..blob_n} after them.
-- Errors: RB_NOTREE, RB_EMPTY.
local meta, items, tree, tree_ids = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local conf = redis.call('HMGET', meta, 'tree', 'tree_size')
if conf[1] ~= '1' then return fail('RB_NOTREE', 'prioritized sampling is not enabled') end
local size = tonumber(conf[2])
local total = tonumber(redis.call('HGET', tree, 1) or '0')
if total <= 0 then
  return fail('RB_EMPTY', 'buffer is empty (no item with a finite log-reward)')
end
local n = tonumber(ARGV[1])
if #ARGV[3] ~= 6 * n then return fail('RB_INVALID', 'expected ' .. n .. ' packed uniforms') end
local nodes, targets = {}, {}
for i = 1, n do
  nodes[i] = 1
  targets[i] = uniform_at(ARGV[3], i) * total
end
local width = size
while width > 1 do
  -- draws share nodes near the root: fetch each distinct node's children once
  local children, position = {}, {}
  for i = 1, n do
    local node = nodes[i]
    if position[node] == nil then
      position[node] = #children + 1
      children[#children + 1] = 2 * node
      children[#children + 1] = 2 * node + 1
    end
  end
  local values = hmget_chunked(tree, children)
  for i = 1, n do
    local at = position[nodes[i]]
    local left = tonumber(values[at]) or 0
    local right = tonumber(values[at + 1]) or 0
    -- rounding may leave a target past the mass of its subtree: never step into an empty one
    if (targets[i] < left and left > 0) or right <= 0 then
      nodes[i] = 2 * nodes[i]
      if targets[i] >= left then targets[i] = left * 0.5 end
    else
      nodes[i] = 2 * nodes[i] + 1
      targets[i] = math.min(targets[i] - left, right * (1 - 1e-12))
    end
  end
  width = width / 2
end
local slots = {}
for i = 1, n do slots[i] = nodes[i] - size end
local ids = hmget_chunked(tree_ids, slots)
local weights = hmget_chunked(tree, nodes)
redis.call('HINCRBY', meta, 'sampled', n)
local out = {fmt(total)}
for i = 1, n do out[1 + i] = ids[i] end
for i = 1, n do out[1 + n + i] = weights[i] end
if ARGV[2] == '1' then
  local blobs = hmget_chunked(items, ids)
  for i = 1, n do out[1 + 2 * n + i] = blobs[i] end
end
return out
