-- Fix a buffer's rate limiter (redisbuf/sampling/limiters.py) when it is created.
-- @keys 1
-- @retry safe
-- KEYS[1] meta
-- ARGV[1] samples_per_insert  ARGV[2] min_size_to_sample  ARGV[3] min_diff
-- ARGV[4] max_diff  (all "" = no limiter asked; diffs may be "-inf" / "inf")
-- The limiter is stored when the buffer has none yet and has never held an item
-- (last_id 0), so every process counts from the first insert.
-- Returns the stored {rl_spi, rl_min_size, rl_min_diff, rl_max_diff} ("" each: none).
-- Errors: RB_NOBUF.
local meta = KEYS[1]
local conf = redis.call('HMGET', meta, 'capacity', 'last_id', 'rl_spi', 'rl_min_size',
  'rl_min_diff', 'rl_max_diff')
if not conf[1] then
  return redis.error_reply('RB_NOBUF buffer meta ' .. meta .. ' does not exist')
end
if not conf[3] and ARGV[1] ~= '' and tonumber(conf[2]) == 0 then
  redis.call('HSET', meta, 'rl_spi', ARGV[1], 'rl_min_size', ARGV[2], 'rl_min_diff', ARGV[3],
    'rl_max_diff', ARGV[4])
  return {ARGV[1], ARGV[2], ARGV[3], ARGV[4]}
end
return {conf[3] or '', conf[4] or '', conf[5] or '', conf[6] or ''}
