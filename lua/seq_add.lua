-- Append one step per listed environment, evict beyond max_length, atomically.
-- @include common
-- @include masslog
-- @include seq
-- @include history
-- @keys 10
-- @retry never
-- KEYS[1] meta  KEYS[2..10] steps, envs, episodes, begins, rewards, returns, prio,
-- masslog, snap
-- (SequenceKeys.all_keys() order, see seq_keys in _seq.lua)
-- ARGV[1] schema (canonical JSON; set by the first add, must match afterwards)
-- ARGV[2] n, the number of steps
-- ARGV[3..] per step: env id, blob, flags (1 = starts an episode, 2 = ends one, 3 = both,
-- 0 = neither), reward as text ("" when returns are not recorded)
-- A step begins a new episode when its environment holds no step, when the previous
-- step ended an episode, or when its flags say so. When a step ends an episode, every
-- stored earlier step t of that episode gets discounted_return(t) = clip(r(t+1)) +
-- gamma * discounted_return(t+1), the last step counting as 0 (ALF's convention).
-- Counts the steps in meta "added" and "evicted", and records the rate history
-- (_history.lua) from "added", "evicted", "sampled": units are steps.
-- Returns the positions given to the steps. Errors: RB_NOBUF, RB_SCHEMA, RB_INVALID.
local K = seq_keys(KEYS)
local C = seq_conf(K)
if not C then return fail('RB_NOBUF', 'sequence buffer meta ' .. K.meta .. ' does not exist') end
local n = tonumber(ARGV[2])
for i = 1, n do
  local e = tonumber(ARGV[4 * i - 1])
  if e == nil or e < 0 or e >= C.num_envs or e ~= math.floor(e) then
    return fail('RB_INVALID', 'env id ' .. tostring(ARGV[4 * i - 1]) .. ' is not in [0, '
      .. C.num_envs .. ')')
  end
end
local schema = redis.call('HGET', K.meta, 'schema')
if not schema then
  redis.call('HSET', K.meta, 'schema', ARGV[1])
elseif schema ~= ARGV[1] then
  return fail('RB_SCHEMA', schema)
end

local states, touched = {}, {}
local changes = {}
local initial
if C.prioritized then
  initial = math.max(C.initial_priority, tonumber(redis.call('HGET', K.meta, 'max_priority')) or 0)
end
local positions = {}
for i = 1, n do
  local e = tonumber(ARGV[4 * i - 1])
  local blob, flags, reward = ARGV[4 * i], tonumber(ARGV[4 * i + 1]), ARGV[4 * i + 2]
  local S = states[e]
  if not S then
    S = env_state(K, e)
    states[e] = S
    touched[#touched + 1] = e
  end
  local p = S.next
  local empty = S.next == S.start
  if empty or S.ended or flags % 2 == 1 then
    S.cur = p
    if empty then S.first = p end
    redis.call('ZADD', K.episodes, 1, episode_member(e, p))
    redis.call('ZADD', K.begins, 0, episode_member(e, p))
  else
    redis.call('ZINCRBY', K.episodes, 1, episode_member(e, S.cur))
  end
  local field = step_field(e, p)
  redis.call('HSET', K.steps, field, blob)
  if C.returns then redis.call('HSET', K.rewards, field, reward) end
  if C.prioritized then changes[#changes + 1] = {slot_of(C, e, p), initial} end
  S.next = p + 1
  S.ended = flags >= 2
  redis.call('HINCRBY', K.meta, 'size', 1)
  if S.next - S.start > C.max_length then
    -- the new step took the evicted step's slot: its priority replaces the old one
    evict_oldest(K, C, e, S, nil)
    redis.call('HINCRBY', K.meta, 'evicted', 1)
  end
  if C.returns and S.ended then
    local lo = math.max(S.cur, S.start)
    local fields = {}
    for t = lo, p do fields[#fields + 1] = step_field(e, t) end
    local rewards = hmget_chunked(K.rewards, fields)
    local g, out = 0, {}
    for t = p - 1, lo, -1 do
      local r = tonumber(rewards[t + 2 - lo])
      if r < C.clip_low then r = C.clip_low end
      if r > C.clip_high then r = C.clip_high end
      g = r + C.gamma * g
      out[#out + 1] = step_field(e, t)
      out[#out + 1] = fmt(g)
    end
    call_chunked('HSET', K.returns, out)
  end
  positions[i] = p
end
for _, e in ipairs(touched) do save_env_state(K, e, states[e]) end
redis.call('HINCRBY', K.meta, 'added', n)
record_history(K.meta, {'added', 'evicted', 'sampled'})
if C.prioritized then seq_set_priorities(K, changes) end
return positions
