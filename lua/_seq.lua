-- Per-environment streams (SequenceBuffer), pasted in place of "-- @include seq" (needs
-- common and tree). Not an operation of its own.
-- Keys (redisbuf/buffers/sequence.py, SequenceKeys.all_keys() order): meta, steps, envs, episodes,
-- begins, rewards, returns, tree. A step is named by its environment e and its position p
-- (positions only grow); its fields are "e:p". An episode is named by the member
-- "eeeeee:ppppppppppppppp" (env and the position it began at, zero-padded so that the
-- lex order of `begins` is (env, begin) order); `episodes` scores it with the number of
-- its steps still stored.

local function seq_keys(keys)
  return {
    meta = keys[1], steps = keys[2], envs = keys[3], episodes = keys[4], begins = keys[5],
    rewards = keys[6], returns = keys[7], tree = keys[8],
  }
end

local function step_field(e, p)
  return string.format('%d:%d', e, p)
end

local function episode_member(e, p)
  return string.format('%06d:%015d', e, p)
end

local function parse_member(member)
  return tonumber(string.sub(member, 1, 6)), tonumber(string.sub(member, 8))
end

-- The configuration fields every script reads, as numbers / flags.
local function seq_conf(K)
  local raw = redis.call('HMGET', K.meta, 'num_environments', 'max_length', 'returns',
    'gamma', 'default_return', 'clip_low', 'clip_high', 'prioritized', 'tree_depth',
    'initial_priority')
  if not raw[1] then return nil end
  return {
    num_envs = tonumber(raw[1]), max_length = tonumber(raw[2]), returns = raw[3] == '1',
    gamma = tonumber(raw[4]), default_return = tonumber(raw[5]),
    clip_low = to_number(raw[6]), clip_high = to_number(raw[7]),
    prioritized = raw[8] == '1', depth = tonumber(raw[9]),
    initial_priority = tonumber(raw[10]),
  }
end

-- The stream state of environment e: next (position the next step gets), start (oldest
-- stored position; next == start when empty), cur (begin of the newest episode), first
-- (begin of the oldest stored episode), ended (the newest step ended its episode).
local function env_state(K, e)
  local raw = redis.call('HMGET', K.envs, 'next:' .. e, 'start:' .. e, 'cur:' .. e,
    'first:' .. e, 'ended:' .. e)
  return {
    next = tonumber(raw[1]) or 0, start = tonumber(raw[2]) or 0,
    cur = tonumber(raw[3]) or 0, first = tonumber(raw[4]) or 0, ended = raw[5] == '1',
  }
end

local function save_env_state(K, e, S)
  redis.call('HSET', K.envs, 'next:' .. e, S.next, 'start:' .. e, S.start,
    'cur:' .. e, S.cur, 'first:' .. e, S.first, 'ended:' .. e, S.ended and 1 or 0)
end

-- The sum-tree leaf of (e, p): one fixed slot per ring index.
local function leaf_slot(C, e, p)
  return e * C.max_length + p % C.max_length
end

-- Set sum-tree leaves (list of {node, mass}, a later entry for a node winning) as
-- tree_set_nodes does, and move meta "nonzero", the number of stored steps of non-zero
-- priority, by the leaves that become or stop being non-zero: importance weights divide
-- by the mean non-zero priority (ALF), so that a priority set to 0 (ALF's way to exclude
-- a window) does not inflate the others. A leaf's old mass is read from its parent's chunk.
local function seq_set_leaves(K, leaves)
  local final, nodes, parents = {}, {}, {}
  for _, leaf in ipairs(leaves) do
    if final[leaf[1]] == nil then
      nodes[#nodes + 1] = leaf[1]
      parents[#parents + 1] = math.floor((leaf[1] - 1) / FANOUT)
    end
    final[leaf[1]] = leaf[2]
  end
  local chunks = hmget_chunked(K.tree, parents)
  local change = 0
  for i, node in ipairs(nodes) do
    local old = chunks[i] and chunk_entry(chunks[i], (node - 1) % FANOUT) or 0
    if old > 0 then change = change - 1 end
    if final[node] > 0 then change = change + 1 end
  end
  if change ~= 0 then redis.call('HINCRBY', K.meta, 'nonzero', change) end
  tree_set_nodes(K.tree, leaves)
end

-- Remove the oldest stored step of e (S.start) from every structure; the tree leaf is
-- zeroed into `leaves` (list of {node, mass}) when given.
local function evict_oldest(K, C, e, S, leaves)
  local s = S.start
  local field = step_field(e, s)
  redis.call('HDEL', K.steps, field)
  if C.returns then
    redis.call('HDEL', K.rewards, field)
    redis.call('HDEL', K.returns, field)
  end
  if leaves then
    leaves[#leaves + 1] = {first_leaf(C.depth) + leaf_slot(C, e, s), 0}
  end
  local member = episode_member(e, S.first)
  local left = tonumber(redis.call('ZINCRBY', K.episodes, -1, member))
  if left <= 0 then
    -- the oldest episode is gone; the step after it began the next one
    redis.call('ZREM', K.episodes, member)
    redis.call('ZREM', K.begins, member)
    S.first = s + 1
  end
  S.start = s + 1
  redis.call('HINCRBY', K.meta, 'size', -1)
end

-- The episode holding stored step (e, p): its begin (maybe no longer stored) and its last
-- stored position.
local function episode_of(K, e, p, S)
  local found = redis.call('ZREVRANGEBYLEX', K.begins, '[' .. episode_member(e, p),
    '[' .. episode_member(e, 0), 'LIMIT', 0, 1)
  local member = found[1]
  local _, begin = parse_member(member)
  local length = tonumber(redis.call('ZSCORE', K.episodes, member))
  return begin, math.max(begin, S.start) + length - 1
end

