-- Create a SequenceBuffer's meta hash, or check that the stored configuration matches.
-- @include common
-- @include masslog
-- @include seq
-- @keys 10
-- @retry never
-- KEYS[1] meta  KEYS[2..10] steps, envs, episodes, begins, rewards, returns, prio,
-- masslog, snap
-- ARGV[1] configuration as canonical JSON
-- ARGV[2..] field, value pairs stored in meta on creation (numbers the scripts read)
-- A prioritized buffer (meta prioritized = 1) is created with its mass log on (meta masslog
-- = 1, mass = per, per_alpha = 1, per_eps = 0: a step's mass is its priority) and a
-- first X entry (lua/_masslog.lua), so samplers' replicas can read it from the start.
-- Returns 1 when created, 0 when the buffer existed with the same configuration.
-- Errors: RB_CONFIG (the buffer exists with another configuration).
local K = seq_keys(KEYS)
local stored = redis.call('HGET', K.meta, 'config')
if stored then
  if stored ~= ARGV[1] then
    return redis.error_reply('RB_CONFIG stored configuration ' .. stored
      .. ' differs from the requested ' .. ARGV[1])
  end
  return 0
end
local pairs_ = {'config', ARGV[1], 'size', 0, 'added', 0, 'evicted', 0,
  'sampled', 0, 'nonzero', 0}
local prioritized = false
for i = 2, #ARGV, 2 do
  pairs_[#pairs_ + 1] = ARGV[i]
  pairs_[#pairs_ + 1] = ARGV[i + 1]
  if ARGV[i] == 'prioritized' and ARGV[i + 1] == '1' then prioritized = true end
end
if prioritized then
  local more = {'masslog', '1', 'mass', 'per', 'per_alpha', '1', 'per_eps', '0',
    'prio_sum', '0', 'prio_comp', '0'}
  for _, value in ipairs(more) do pairs_[#pairs_ + 1] = value end
end
redis.call('HSET', K.meta, unpack(pairs_))
if prioritized then masslog_reset(K) end
return 1
