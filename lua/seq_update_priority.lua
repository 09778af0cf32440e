-- Set the priorities of stored steps (ALF's update_priority), atomically.
-- @include common
-- @include tree
-- @include seq
-- KEYS[1] meta  KEYS[2..8] steps, envs, episodes, begins, rewards, returns, tree
-- ARGV[1] n  ARGV[2..] per step: env id, position, priority (text, finite and >= 0)
-- Steps no longer stored (evicted, dequeued) are skipped, as in ALF. Returns the number of
-- priorities set. Errors: RB_NOBUF, RB_CONFIG (not prioritized), RB_INVALID.
local K = seq_keys(KEYS)
local C = seq_conf(K)
if not C then return fail('RB_NOBUF', 'sequence buffer meta ' .. K.meta .. ' does not exist') end
if not C.prioritized then return fail('RB_CONFIG', 'the buffer was made with prioritized=False') end
local n = tonumber(ARGV[1])
for i = 1, n do
  local e, priority = tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i + 1])
  if e == nil or e < 0 or e >= C.num_envs then
    return fail('RB_INVALID', 'env id ' .. tostring(ARGV[3 * i - 1]) .. ' is out of range')
  end
  if priority == nil or priority ~= priority or priority < 0 or priority == math.huge then
    return fail('RB_INVALID', 'priority ' .. tostring(ARGV[3 * i + 1])
      .. ' is not a finite number >= 0')
  end
end
local leaf0 = first_leaf(C.depth)
local leaves, states, top = {}, {}, 0
for i = 1, n do
  local e, p, priority = tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1])
  local S = states[e]
  if not S then
    S = env_state(K, e)
    states[e] = S
  end
  if p >= S.start and p < S.next then
    leaves[#leaves + 1] = {leaf0 + leaf_slot(C, e, p), priority}
    if priority > top then top = priority end
  end
end
local stored = tonumber(redis.call('HGET', K.meta, 'max_priority')) or 0
if top > stored then redis.call('HSET', K.meta, 'max_priority', fmt(top)) end
seq_set_leaves(K, leaves)
return #leaves
