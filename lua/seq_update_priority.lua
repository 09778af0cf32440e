-- Set the priorities of stored steps (ALF's update_priority), atomically.
-- @include common
-- @include masslog
-- @include seq
-- @keys 10
-- @retry never
-- KEYS[1] meta  KEYS[2..10] steps, envs, episodes, begins, rewards, returns, prio,
-- masslog, snap
-- ARGV[1] n  ARGV[2..] per step: env id, position, priority (text, finite and >= 0)
-- Steps no longer stored (evicted, dequeued) are skipped, as in ALF. O(1) server work per
-- step (see seq_set_priorities): one mass-log entry for the call.
-- Returns {set, log_epoch, log_version before, log_version after, log_stamp before,
-- log_stamp after, slots, priorities}: the number of priorities set, what a replica at the
-- version before needs to apply this change itself (the versions differ by one when this
-- call's entry is the only change), and the entry's slots and new priorities
-- (comma-separated). Errors: RB_NOBUF, RB_CONFIG (not prioritized), RB_INVALID.
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
local changes, states, top = {}, {}, 0
for i = 1, n do
  local e, p, priority = tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1])
  local S = states[e]
  if not S then
    S = env_state(K, e)
    states[e] = S
  end
  if p >= S.start and p < S.next then
    changes[#changes + 1] = {slot_of(C, e, p), priority}
    if priority > top then top = priority end
  end
end
local conf = redis.call('HMGET', K.meta, 'max_priority', 'log_epoch', 'log_version', 'log_stamp')
if top > (tonumber(conf[1]) or 0) then redis.call('HSET', K.meta, 'max_priority', fmt(top)) end
local slots, values = seq_set_priorities(K, changes)
local after = redis.call('HMGET', K.meta, 'log_version', 'log_stamp')
return {#changes, conf[2] or '', conf[3] or '0', after[1] or '0', conf[4] or '', after[2] or '',
  table.concat(slots, ','), table.concat(values, ',')}
