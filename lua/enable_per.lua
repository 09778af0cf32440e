-- Turn on prioritized experience replay (PER): from now on the PER priorities are the mass
-- log (lua/_masslog.lua, meta log_truth = 1) and the snapshots that following replicas
-- write of it; add.lua, update_priority.lua and the removers append every change to it,
-- whichever process writes, and PERSampler draws from a replica of them, with masses
-- (priority + eps)^alpha (redisbuf/sampling/replica.py). O(1) however full the buffer:
-- the items present now get initial_priority by the log's first entry (an X, the new
-- epoch: meta per_base holds that priority, which a replica reading this epoch without a
-- snapshot gives every item present at the X).
-- @include common
-- @include masslog
-- @include items
-- @keys 13
-- @retry safe
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order
-- ARGV[1] alpha  ARGV[2] eps  ARGV[3] initial_priority  (numbers as text)
-- ARGV[4] (unused: earlier versions gave the items their priority a slice a call)
-- Alpha, eps and initial_priority are the buffer's from then on: every process must ask
-- for the same. A buffer of the earlier layout (priorities in the per hash, no log_truth)
-- starts a new epoch whose base is that hash (meta per_legacy = 1): the first replica
-- reads it and publishes a snapshot, which unlinks the hash (lua/snapshot_commit.lua).
-- Returns 1 when this call turned it on, 0 when it was on with these settings.
-- Errors: RB_NOBUF, RB_CONFIG (other settings, or softmax sampling is in use).
local K = buffer_keys(KEYS)
local conf = redis.call('HMGET', K.meta, 'capacity', 'masslog', 'mass', 'per_alpha', 'per_eps',
  'per_initial', 'log_truth')
if not conf[1] then return fail('RB_NOBUF', 'buffer meta ' .. K.meta .. ' does not exist') end
local alpha, eps, initial = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if conf[3] == 'per' then
  if tonumber(conf[4]) ~= alpha or tonumber(conf[5]) ~= eps or tonumber(conf[6]) ~= initial then
    return fail('RB_CONFIG', 'buffer ' .. K.meta .. ' uses PER with alpha=' .. conf[4]
      .. ', eps=' .. conf[5] .. ', initial_priority=' .. conf[6] .. ', not alpha=' .. ARGV[1]
      .. ', eps=' .. ARGV[2] .. ', initial_priority=' .. ARGV[3] .. ' (PER settings mismatch)')
  end
  if conf[7] == '1' and conf[2] == '1' and redis.call('HGET', K.meta, 'log_stamp') then
    return 0
  end
  if conf[7] ~= '1' then  -- the earlier layout: its per hash is the new epoch's base
    redis.call('HSET', K.meta, 'per_legacy', '1')
  end
  redis.call('HDEL', K.meta, 'per_fill', 'per_fill_end', 'per_sum', 'per_comp', 'per_nonzero')
  redis.call('HSET', K.meta, 'masslog', '1', 'log_truth', '1', 'per_base', ARGV[3])
  masslog_reset(K)
  return 1
end
if conf[2] == '1' then
  return fail('RB_CONFIG', 'buffer ' .. K.meta .. ' samples by softmax of log-rewards'
    .. ' (prioritized_sampling): it cannot also sample by PER priorities')
end
redis.call('HSET', K.meta, 'per_alpha', ARGV[1], 'per_eps', ARGV[2], 'per_initial', ARGV[3],
  'mass', 'per', 'masslog', '1', 'log_truth', '1', 'per_base', ARGV[3])
redis.call('HDEL', K.meta, 'per_max', 'per_legacy')
masslog_reset(K)
return 1
