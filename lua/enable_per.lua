-- Turn on prioritized experience replay (PER): PER priorities in the per hash, and from
-- now on every change to them appended to the mass log (lua/_masslog.lua) by add.lua,
-- update_priority.lua and the removers, whichever process writes; PERSampler draws from a
-- replica of them, with masses (priority + eps)^alpha (redisbuf/sampling/replica.py).
-- @include common
-- @include masslog
-- @include items
-- @keys 13
-- @retry safe
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order
-- ARGV[1] alpha  ARGV[2] eps  ARGV[3] initial_priority  (numbers as text)
-- ARGV[4] how many present items one call gives their priority (a slice)
-- Items present without a PER priority get initial_priority, a slice of them per call in
-- id order (meta per_fill: the last id done, per_fill_end: the last id present when PER
-- was turned on; items added meanwhile get theirs as they are added), so no call holds
-- the server long however full the buffer; the caller calls again while it returns 2.
-- Until the last slice update_priority refuses (RB_BUSY) and sampling is not on yet.
-- Alpha, eps and initial_priority are the buffer's from then on: every process must ask
-- for the same.
-- Returns 1 when this call finished turning it on, 2 when more slices remain, 0 when it
-- was on with these settings.
-- Errors: RB_NOBUF, RB_CONFIG (other settings, or softmax sampling is in use).
local K = buffer_keys(KEYS)
local conf = redis.call('HMGET', K.meta, 'capacity', 'masslog', 'mass', 'per_alpha', 'per_eps',
  'per_initial', 'per_fill', 'last_id')
if not conf[1] then return fail('RB_NOBUF', 'buffer meta ' .. K.meta .. ' does not exist') end
local alpha, eps, initial = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local slice = tonumber(ARGV[4])
if conf[3] == 'per' then
  if tonumber(conf[4]) ~= alpha or tonumber(conf[5]) ~= eps or tonumber(conf[6]) ~= initial then
    return fail('RB_CONFIG', 'buffer ' .. K.meta .. ' uses PER with alpha=' .. conf[4]
      .. ', eps=' .. conf[5] .. ', initial_priority=' .. conf[6] .. ', not alpha=' .. ARGV[1]
      .. ', eps=' .. ARGV[2] .. ', initial_priority=' .. ARGV[3] .. ' (PER settings mismatch)')
  end
  if not conf[7] then
    if conf[2] ~= '1' or not redis.call('HGET', K.meta, 'log_stamp') then  -- no log yet
      redis.call('HSET', K.meta, 'masslog', '1')
      masslog_reset(K)
    end
    return 0
  end
else
  if conf[2] == '1' then
    return fail('RB_CONFIG', 'buffer ' .. K.meta .. ' samples by softmax of log-rewards'
      .. ' (prioritized_sampling): it cannot also sample by PER priorities')
  end
  conf[7] = '0'
  redis.call('HSET', K.meta, 'per_alpha', ARGV[1], 'per_eps', ARGV[2], 'per_initial', ARGV[3],
    'mass', 'per', 'per_fill', 0, 'per_fill_end', conf[8] or 0)
  redis.call('HDEL', K.meta, 'per_sum', 'per_comp', 'per_nonzero', 'per_max')
end
local fill_end = redis.call('HGET', K.meta, 'per_fill_end')
local ids = redis.call('ZRANGEBYSCORE', K.order, '(' .. conf[7], fill_end, 'LIMIT', 0, slice)
local scores = per_texts(K, ids)
local missing, values = {}, {}
for i, id in ipairs(ids) do
  if not scores[i] then
    missing[#missing + 1] = id
    missing[#missing + 1] = fmt(initial)
    values[#values + 1] = initial
  end
end
call_chunked('HSET', K.per, missing)
per_account(K, {}, values)
if #values > 0 then per_raise_max(K, initial) end
if #ids == slice then
  redis.call('HSET', K.meta, 'per_fill', tonumber(ids[#ids]))
  return 2
end
redis.call('HDEL', K.meta, 'per_fill', 'per_fill_end')
redis.call('HSET', K.meta, 'masslog', '1')
masslog_reset(K)
return 1
