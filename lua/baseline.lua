-- The manager's baseline log-reward, read together with the EMA update, atomically.
-- @include common
-- @include baseline
-- @keys 3
-- @retry never
-- KEYS[1] meta  KEYS[2] prio  KEYS[3] order
-- ARGV[1] strategy: "min" | "percentile" | "ema"
-- ARGV[2] q in [0, 1] (percentile)   ARGV[3] alpha in (0, 1] (ema)
-- ARGV[4] "1" = the buffer may answer (the manager stores locally), "0" = EMA only
-- ARGV[5] the incoming batch's smallest finite log-reward, or "" when it has none
-- See baseline_answer in _baseline.lua for the rule (non-finite log-rewards never count).
-- Returns {source, value}: source "buffer" | "ema" | "none" (value "" for "none").
-- Errors: RB_NOBUF (the buffer was dropped: the EMA must not recreate its meta).
local meta = KEYS[1]
local conf = redis.call('HMGET', meta, 'capacity', 'baseline_ema')
if not conf[1] then
  return fail('RB_NOBUF', 'buffer meta ' .. meta .. ' does not exist')
end
return baseline_answer(meta, KEYS[2], KEYS[3], conf[1], conf[2], ARGV[1], tonumber(ARGV[2]),
  tonumber(ARGV[3]), ARGV[4], ARGV[5])
