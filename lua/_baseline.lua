-- The manager's baseline log-reward, a helper scripts name with "-- @include baseline":
-- shared by baseline.lua and manager_score.lua, so both answer alike.
-- @include common

-- Fold batch_min (text: the incoming batch's smallest finite log-reward, "" when it has
-- none) into meta field baseline_ema: ema = alpha * m + (1 - alpha) * ema, the first batch
-- setting ema = m. Then, for "min" / "percentile" with store_locally = "1" and the buffer
-- at capacity, answer from the finite priorities in prio: the smallest, or the
-- q-quantile interpolated linearly between order statistics (torch.quantile's default).
-- Otherwise (or when prio holds no finite value) answer the EMA.
-- Non-finite log-rewards never enter a baseline: -inf and +inf members of prio are
-- skipped (an all-infinite buffer answers the EMA); the caller passes a finite batch_min.
-- O(log n): -inf members sort first and +inf last, so the finite order statistics are
-- the ranks between the two ZCOUNTs.
-- `capacity` and `ema_text` are the meta's fields, read by the caller (which has checked
-- that meta exists: the EMA must not recreate a dropped buffer's meta).
-- Returns {source, value}: source "buffer" | "ema" | "none" (value "" for "none").
local function baseline_answer(meta, prio, order, capacity, ema_text, strategy, q, alpha,
                               store_locally, batch_min)
  local ema = tonumber(ema_text or '')
  if batch_min ~= '' then
    local m = tonumber(batch_min)
    if ema == nil then
      ema = m
    else
      ema = alpha * m + (1 - alpha) * ema
    end
    redis.call('HSET', meta, 'baseline_ema', fmt(ema))
  end

  -- the score at rank r of the prio zset, as a number
  local function at_rank(r)
    return to_number(redis.call('ZRANGE', prio, r, r, 'WITHSCORES')[2])
  end

  capacity = tonumber(capacity) or 0
  if store_locally == '1' and (strategy == 'min' or strategy == 'percentile')
      and capacity > 0 and redis.call('ZCARD', order) >= capacity then
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

  if ema == nil then return {'none', ''} end
  return {'ema', fmt(ema)}
end
