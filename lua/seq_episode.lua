-- Episode of stored steps: where it began and its last stored step.
-- @include common
-- @include masslog
-- @include seq
-- @keys 10
-- @retry never
-- KEYS[1] meta  KEYS[2..10] steps, envs, episodes, begins, rewards, returns, prio,
-- masslog, snap
-- ARGV[1] n  ARGV[2..] per step: env id, position
-- Returns {begin_1, last_1, ..., begin_n, last_n}: the position the step's episode began
-- at (possibly no longer stored) and the position of its newest stored step (the episode's
-- last step when it has ended). Errors: RB_NOBUF, RB_INVALID (a step not stored).
local K = seq_keys(KEYS)
local C = seq_conf(K)
if not C then return fail('RB_NOBUF', 'sequence buffer meta ' .. K.meta .. ' does not exist') end
local n = tonumber(ARGV[1])
local out, states = {}, {}
for i = 1, n do
  local e, p = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  if e == nil or e < 0 or e >= C.num_envs then
    return fail('RB_INVALID', 'env id ' .. tostring(ARGV[2 * i]) .. ' is out of range')
  end
  local S = states[e]
  if not S then
    S = env_state(K, e)
    states[e] = S
  end
  if p == nil or p < S.start or p >= S.next then
    return fail('RB_INVALID', 'step ' .. tostring(ARGV[2 * i + 1]) .. ' of env ' .. e
      .. ' is not stored (stored: [' .. S.start .. ', ' .. S.next .. '))')
  end
  local begin, last = episode_of(K, e, p, S)
  out[2 * i - 1] = begin
  out[2 * i] = last
end
return out
