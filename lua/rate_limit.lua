-- Admit (or refuse) an insert or a sample under the buffer's rate limiter, and count it,
-- in one step for every process (Reverb's RateLimiter; redisbuf/sampling/limiters.py).
-- @include common
-- @include admission
-- @keys 2
-- @retry never
-- KEYS[1] meta  KEYS[2] order (its length is the buffer's size)
-- ARGV[1] "insert" | "sample" | "unsert" | "unsample" (the last two take back n counted
-- calls whose operation then failed) | "insert_upto" | "sample_upto" | "can_insert" |
-- "can_sample"  ARGV[2] n, the call's number of items
-- Meta: rl_spi, rl_min_size, rl_min_diff, rl_max_diff (configuration; none = no limiter)
-- and the counters rl_inserts, rl_samples. With diff = rl_inserts * rl_spi - rl_samples:
-- an insert is admitted while size + 1 <= rl_min_size or diff + rl_spi <= rl_max_diff;
-- a sample while size >= rl_min_size and diff - 1 >= rl_min_diff. A call of n items is
-- admitted when one more item would be, then counts all n. "insert_upto" and
-- "sample_upto" admit and count k <= n items, as many as the rule admits one after the
-- other (Reverb's table, an item at a time), counting the size as it is now; a sample's
-- k is also at most size - rl_min_size + 1 when meta max_use is set (each sample might
-- remove an item). "can_insert" and "can_sample" count nothing and answer Reverb's
-- can_insert(n) / can_sample(n): size + n <= rl_min_size or (rl_inserts + n) * rl_spi -
-- rl_samples <= rl_max_diff; size >= rl_min_size and diff - n >= rl_min_diff.
-- Admissions and take-backs wake waiters (notify_changed).
-- Returns {admitted (1 | 0; for the upto forms k), rl_inserts, rl_samples, size}
-- (counters as text, after the call). Errors: RB_INVALID (unknown operation).
refuse_while_applying(KEYS[1])  -- its size counts the buffer's items
local meta = KEYS[1]
local op, n = ARGV[1], tonumber(ARGV[2])
local conf = redis.call('HMGET', meta, 'rl_spi', 'rl_min_size', 'rl_min_diff', 'rl_max_diff',
  'rl_inserts', 'rl_samples')
local size = redis.call('ZCARD', KEYS[2])
local inserts, samples = tonumber(conf[5]) or 0, tonumber(conf[6]) or 0
local admitted = 1
if not conf[1] and (op == 'insert_upto' or op == 'sample_upto') then admitted = n end
if conf[1] then
  local spi, min_size = tonumber(conf[1]), tonumber(conf[2])
  local min_diff, max_diff = to_number(conf[3]), to_number(conf[4])
  local diff = inserts * spi - samples
  if op == 'can_insert' then
    local ok = size + n <= min_size or (inserts + n) * spi - samples <= max_diff
    return {ok and 1 or 0, tostring(inserts), tostring(samples), size}
  elseif op == 'can_sample' then
    local ok = size >= min_size and diff - n >= min_diff
    return {ok and 1 or 0, tostring(inserts), tostring(samples), size}
  elseif op == 'insert_upto' or op == 'sample_upto' then
    local k = 0
    if op == 'insert_upto' then
      k = inserts_admitted(meta, KEYS[2], n)  -- lua/_admission.lua
    else
      k = samples_admitted(meta, KEYS[2], n)  -- lua/_admission.lua
    end
    if k < 0 then k = 0 end
    if k > 0 then
      if op == 'insert_upto' then inserts = redis.call('HINCRBY', meta, 'rl_inserts', k)
      else samples = redis.call('HINCRBY', meta, 'rl_samples', k) end
      notify_changed(meta)
    end
    return {k, tostring(inserts), tostring(samples), size}
  elseif op == 'insert' then
    if not (size + 1 <= min_size or diff + spi <= max_diff) then admitted = 0 end
  elseif op == 'sample' then
    if not (size >= min_size and diff - 1 >= min_diff) then admitted = 0 end
  elseif op ~= 'unsert' and op ~= 'unsample' then
    return fail('RB_INVALID', 'unknown rate limiter operation ' .. tostring(op))
  end
  if admitted == 1 then
    if op == 'insert' then inserts = redis.call('HINCRBY', meta, 'rl_inserts', n)
    elseif op == 'sample' then samples = redis.call('HINCRBY', meta, 'rl_samples', n)
    elseif op == 'unsert' then inserts = redis.call('HINCRBY', meta, 'rl_inserts', -n)
    else samples = redis.call('HINCRBY', meta, 'rl_samples', -n) end
    notify_changed(meta)
  end
end
return {admitted, tostring(inserts), tostring(samples), size}
