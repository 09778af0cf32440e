-- Read a fragment buffer's counters and metric sums; with ARGV[1] = "1" also reset the
-- metric sums (MineStudio resets its reuse and staleness metrics after each report).
-- @keys 3
-- @retry never
-- KEYS[1] meta  KEYS[2] chunks  KEYS[3] pending
-- ARGV[1] "1" = reset the reuse and staleness sums, "0" = only read
-- Returns {HGETALL of meta, chunks stored, streams with pending fragments}.
local meta = redis.call('HGETALL', KEYS[1])
if ARGV[1] == '1' then
  redis.call('HSET', KEYS[1], 'reuse_sum', 0, 'reuse_weight', 0,
    'staleness_sum', 0, 'staleness_weight', 0)
end
return {meta, redis.call('ZCARD', KEYS[2]), redis.call('HLEN', KEYS[3])}
