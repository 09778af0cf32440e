-- The manager's baseline log-reward, read together with the EMA update, atomically.
-- @include common
-- KEYS[1] meta  KEYS[2] prio  KEYS[3] order
-- ARGV[1] strategy: "min" | "percentile" | "ema"
-- ARGV[2] q in [0, 1] (percentile)   ARGV[3] alpha in (0, 1] (ema)
-- ARGV[4] "1" = the buffer may answer (the manager stores locally), "0" = EMA only
-- ARGV[5] the incoming batch's smallest finite log-reward, or "" when it has none
-- First folds ARGV[5] into meta field baseline_ema: ema = alpha * m + (1 - alpha) * ema,
-- the first batch setting ema = m. Then, for "min" / "percentile" with ARGV[4] = "1" and
-- the buffer at capacity, answers from the finite priorities in prio: the smallest, or
-- the q-quantile interpolated linearly between order statistics (torch.quantile's
-- default). Otherwise (or when prio holds no finite value) it answers the EMA.
-- Non-finite log-rewards never enter a baseline: -inf and +inf members of prio are
-- skipped (an all-+inf or all--inf buffer answers the EMA), and the caller passes only a
-- finite batch minimum.
-- O(log n): -inf members sort first and +inf last, so the finite order statistics are
-- the ranks between the two ZCOUNTs.
-- Returns {source, value}: source "buffer" | "ema" | "none" (value "" for "none").
-- Errors: RB_NOBUF (the buffer was dropped: the EMA must not recreate its meta).
local meta, prio, order = KEYS[1], KEYS[2], KEYS[3]
local strategy, q, alpha = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

local conf = redis.call('HMGET', meta, 'capacity', 'baseline_ema')
if not conf[1] then
  return fail('RB_NOBUF', 'buffer meta ' .. meta .. ' does not exist')
end
local ema = tonumber(conf[2] or '')
if ARGV[5] ~= '' then
  local batch_min = tonumber(ARGV[5])
  if ema == nil then
    ema = batch_min
  else
    ema = alpha * batch_min + (1 - alpha) * ema
  end
  redis.call('HSET', meta, 'baseline_ema', fmt(ema))
end

-- the score at rank r of the prio zset, as a number
local function at_rank(r)
  return to_number(redis.call('ZRANGE', prio, r, r, 'WITHSCORES')[2])
end

if ARGV[4] == '1' and (strategy == 'min' or strategy == 'percentile') then
  local capacity = tonumber(conf[1]) or 0
  if capacity > 0 and redis.call('ZCARD', order) >= capacity then
    local skipped = redis.call('ZCOUNT', prio, '-inf', '-inf')
    local finite = redis.call('ZCARD', prio) - skipped - redis.call('ZCOUNT', prio, '+inf', '+inf')
    if finite > 0 then
      if strategy == 'min' then
        return {'buffer', fmt(at_rank(skipped))}
      end
      local position = q * (finite - 1)
      local below = math.floor(position)
      local above = math.ceil(position)
      local low = at_rank(skipped + below)
      local high = low
      if above ~= below then high = at_rank(skipped + above) end
      local weight = position - below
      -- the same two-sided lerp as torch, so results agree to the last bit or two
      local value
      if weight < 0.5 then
        value = low + weight * (high - low)
      else
        value = high - (high - low) * (1 - weight)
      end
      return {'buffer', fmt(value)}
    end
  end
end

if ema == nil then return {'none', ''} end
return {'ema', fmt(ema)}
