-- Read (and, for dequeue, remove) the oldest steps of environments, atomically.
-- @include common
-- @include masslog
-- @include seq
-- @keys 10
-- @retry never
-- KEYS[1] meta  KEYS[2..10] steps, envs, episodes, begins, rewards, returns, prio,
-- masslog, snap
-- ARGV[1] mode: "gather" (every stored step of every environment but the oldest ARGV[2];
-- all must hold the same number) or "dequeue" (the oldest ARGV[2] steps of each env in
-- ARGV[3..], removed)
-- ARGV[2] steps skipped (gather) or n (dequeue)  ARGV[3..] env ids (dequeue)
-- Returns {count, number of envs, env_1.., first_position_1.., blobs (env-major)..., returns... if
-- recorded}. Errors: RB_NOBUF, RB_EMPTY (an env holds fewer than n steps; nothing
-- removed), RB_INVALID (unequal sizes for gather, bad env id), RB_LIMIT (nothing read or
-- removed: a gather of more than RB_MAX_ITEMS steps, or of more than RB_MAX_ITEMS
-- environments; a dequeue of more than RB_MAX_ADD steps, n times the environments, since
-- removing a step costs what storing one does; redisbuf/store/bounds.py). A larger
-- gather is read by the client in bounded parts (SequenceBuffer.gather_all).
local K = seq_keys(KEYS)
local C = seq_conf(K)
if not C then return fail('RB_NOBUF', 'sequence buffer meta ' .. K.meta .. ' does not exist') end
local envs, states, count, skip = {}, {}, 0, 0
if ARGV[1] == 'gather' then
  skip = tonumber(ARGV[2])
  if C.num_envs > RB_MAX_ITEMS then
    return fail('RB_LIMIT', 'one command reads at most ' .. RB_MAX_ITEMS .. ' steps, asked '
      .. 'for every step of ' .. C.num_envs .. ' environments')
  end
  for e = 0, C.num_envs - 1 do
    envs[#envs + 1] = e
    states[e] = env_state(K, e)
    local size = states[e].next - states[e].start
    if e == 0 then count = size elseif size ~= count then
      return fail('RB_INVALID', 'environments hold different numbers of steps (env 0: '
        .. count .. ', env ' .. e .. ': ' .. size .. ')')
    end
  end
  skip = math.min(skip, count)
  count = count - skip
  if count * #envs > RB_MAX_ITEMS then
    return fail('RB_LIMIT', 'one command reads at most ' .. RB_MAX_ITEMS .. ' steps, asked '
      .. 'for ' .. count * #envs)
  end
else
  count = tonumber(ARGV[2])
  if count == nil or count * (#ARGV - 2) > RB_MAX_ADD then
    return fail('RB_LIMIT', 'one dequeue removes at most ' .. RB_MAX_ADD .. ' steps, asked '
      .. 'for ' .. tostring(ARGV[2]) .. ' of ' .. (#ARGV - 2) .. ' environments')
  end
  for i = 3, #ARGV do
    local e = tonumber(ARGV[i])
    if e == nil or e < 0 or e >= C.num_envs or states[e] then
      return fail('RB_INVALID', 'env id ' .. tostring(ARGV[i]) .. ' is out of range or repeated')
    end
    envs[#envs + 1] = e
    states[e] = env_state(K, e)
    local size = states[e].next - states[e].start
    if size < count then
      return fail('RB_EMPTY', 'env ' .. e .. ' holds ' .. size .. ' steps, fewer than ' .. count)
    end
  end
end
local out = {count, #envs}
for _, e in ipairs(envs) do out[#out + 1] = e end
for _, e in ipairs(envs) do out[#out + 1] = states[e].start + skip end
local fields = {}
for _, e in ipairs(envs) do
  for j = skip, skip + count - 1 do fields[#fields + 1] = step_field(e, states[e].start + j) end
end
local blobs = hmget_chunked(K.steps, fields)
for i = 1, #fields do out[#out + 1] = blobs[i] end
if C.returns then
  local returns = hmget_chunked(K.returns, fields)
  for i = 1, #fields do out[#out + 1] = returns[i] or fmt(C.default_return) end
end
if ARGV[1] == 'dequeue' then
  local changes = C.prioritized and {} or nil
  for _, e in ipairs(envs) do
    local S = states[e]
    for _ = 1, count do evict_oldest(K, C, e, S, changes) end
    save_env_state(K, e, S)
  end
  if changes then seq_set_priorities(K, changes) end
end
return out
