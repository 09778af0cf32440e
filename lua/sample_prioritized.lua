-- Draw items with probability proportional to exp(log_reward) (softmax), with replacement.
-- @include common
-- KEYS[1] meta  KEYS[2] items  KEYS[3] tree  KEYS[4] tree:ids
-- ARGV[1] n  ARGV[2..n+1] uniforms in [0, 1)
-- Each draw walks the sum tree from the root: O(log capacity) per draw, all draws of one
-- call advancing together so each tree level costs one HMGET.
-- Returns {total, id_1..id_n, weight_1..weight_n, blob_1..blob_n} where weight_i / total is
-- the probability of drawing item i. Errors: RB_NOTREE, RB_EMPTY.
local meta, items, tree, tree_ids = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local conf = redis.call('HMGET', meta, 'tree', 'tree_size')
if conf[1] ~= '1' then return fail('RB_NOTREE', 'prioritized sampling is not enabled') end
local size = tonumber(conf[2])
local total = tonumber(redis.call('HGET', tree, 1) or '0')
if total <= 0 then
  return fail('RB_EMPTY', 'buffer is empty (no item with a finite log-reward)')
end
local n = tonumber(ARGV[1])
local nodes, targets = {}, {}
for i = 1, n do
  nodes[i] = 1
  targets[i] = tonumber(ARGV[1 + i]) * total
end
local width = size
while width > 1 do
  local children = {}
  for i = 1, n do
    children[2 * i - 1] = 2 * nodes[i]
    children[2 * i] = 2 * nodes[i] + 1
  end
  local values = hmget_chunked(tree, children)
  for i = 1, n do
    local left = tonumber(values[2 * i - 1]) or 0
    local right = tonumber(values[2 * i]) or 0
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
local blobs = hmget_chunked(items, ids)
redis.call('HINCRBY', meta, 'sampled', n)
local out = {fmt(total)}
for i = 1, n do out[1 + i] = ids[i] end
for i = 1, n do out[1 + n + i] = weights[i] end
for i = 1, n do out[1 + 2 * n + i] = blobs[i] end
return out
