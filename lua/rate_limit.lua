-- Admit (or refuse) an insert or a sample under the buffer's rate limiter, and count it,
-- in one step for every process (Reverb's RateLimiter; redisbuf/sampling/limiters.py).
-- @include common
-- @keys 2
-- @retry never
-- KEYS[1] meta  KEYS[2] order (its length is the buffer's size)
-- ARGV[1] "insert" | "sample" | "unsert" | "unsample" (the last two take back n counted
-- calls whose operation then failed)  ARGV[2] n, the call's number of items
-- Meta: rl_spi, rl_min_size, rl_min_diff, rl_max_diff (configuration; none = no limiter)
-- and the counters rl_inserts, rl_samples. With diff = rl_inserts * rl_spi - rl_samples:
-- an insert is admitted while size + 1 <= rl_min_size or diff + rl_spi <= rl_max_diff;
-- a sample while size >= rl_min_size and diff - 1 >= rl_min_diff. A call of n items is
-- admitted when one more item would be, then counts all n. Admissions and take-backs
-- wake waiters (notify_changed).
-- Returns {admitted (1 | 0), rl_inserts, rl_samples, size} (counters as text, after the
-- call). Errors: RB_INVALID (unknown operation).
local meta = KEYS[1]
local op, n = ARGV[1], tonumber(ARGV[2])
local conf = redis.call('HMGET', meta, 'rl_spi', 'rl_min_size', 'rl_min_diff', 'rl_max_diff',
  'rl_inserts', 'rl_samples')
local size = redis.call('ZCARD', KEYS[2])
local inserts, samples = tonumber(conf[5]) or 0, tonumber(conf[6]) or 0
local admitted = 1
if conf[1] then
  local spi, min_size = tonumber(conf[1]), tonumber(conf[2])
  local min_diff, max_diff = to_number(conf[3]), to_number(conf[4])
  local diff = inserts * spi - samples
  if op == 'insert' then
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
