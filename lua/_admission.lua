-- A rate limiter's admission of inserts and samples, a helper scripts name with
-- "-- @include admission" (lua/rate_limit.lua, lua/steps_insert.lua, lua/sample_select.lua;
-- redisbuf/sampling/limiters.py).
-- @include common

-- How many of n inserts the buffer's rate limiter admits now, one after the other as
-- Reverb's table admits them (item j while size + j <= rl_min_size or (rl_inserts + j)
-- * rl_spi - rl_samples <= rl_max_diff; both hold for a prefix of j), counting nothing;
-- n when the buffer has no limiter. meta, order: the buffer's keys.
local function inserts_admitted(meta, order, n)
  local conf = redis.call('HMGET', meta, 'rl_spi', 'rl_min_size', 'rl_max_diff', 'rl_inserts',
    'rl_samples')
  if not conf[1] then return n end
  local spi, min_size, max_diff = tonumber(conf[1]), tonumber(conf[2]), to_number(conf[3])
  local inserts, samples = tonumber(conf[4]) or 0, tonumber(conf[5]) or 0
  local size = redis.call('ZCARD', order)
  local function admits(j)
    return size + j <= min_size or (inserts + j) * spi - samples <= max_diff
  end
  local k = math.max(math.max(0, min_size - size),
    math.floor((max_diff + samples) / spi - inserts))
  if k > n then k = n end
  if k < 0 then k = 0 end
  while k > 0 and not admits(k) do k = k - 1 end
  while k < n and admits(k + 1) do k = k + 1 end
  return k
end

-- How many of n samples the buffer's rate limiter admits now, one after the other (sample
-- j while size >= rl_min_size and rl_inserts * rl_spi - rl_samples - j >= rl_min_diff),
-- at most size - rl_min_size + 1 when meta max_use is set (each sample might remove an
-- item), counting nothing; n when the buffer has no limiter.
local function samples_admitted(meta, order, n)
  local conf = redis.call('HMGET', meta, 'rl_spi', 'rl_min_size', 'rl_min_diff', 'rl_inserts',
    'rl_samples', 'max_use')
  if not conf[1] then return n end
  local spi, min_size, min_diff = tonumber(conf[1]), tonumber(conf[2]), to_number(conf[3])
  local diff = (tonumber(conf[4]) or 0) * spi - (tonumber(conf[5]) or 0)
  local size = redis.call('ZCARD', order)
  if size < min_size then return 0 end
  local k = math.floor(diff - min_diff)
  if k > n then k = n end
  if conf[6] then k = math.min(k, size - min_size + 1) end
  if k < 0 then k = 0 end
  while k > 0 and not (diff - k >= min_diff) do k = k - 1 end
  while k < n and diff - (k + 1) >= min_diff do k = k + 1 end
  return k
end
