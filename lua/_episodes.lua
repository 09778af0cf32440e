-- Episode-buffer helpers, a helper scripts name with "-- @include episodes".
-- Not an operation of its own. Steps of all episodes share one growing position counter,
-- so the live steps are the positions [start of the oldest episode, next_pos).
-- @include common

local function pos_str(p)
  return string.format('%d', p)
end

-- Delete the oldest episode everywhere; returns its number of steps.
local function evict_oldest_episode(meta, index, lens, steps)
  local head = redis.call('ZRANGE', index, 0, 0, 'WITHSCORES')
  local id, start = head[1], tonumber(head[2])
  local length = tonumber(redis.call('HGET', lens, id))
  for from = start, start + length - 1, CHUNK do
    local fields = {}
    for p = from, math.min(from + CHUNK - 1, start + length - 1) do
      fields[#fields + 1] = pos_str(p)
    end
    redis.call('HDEL', steps, unpack(fields))
  end
  redis.call('ZREM', index, id)
  redis.call('HDEL', lens, id)
  return length
end

-- The blobs of positions [start, start + length), in order.
local function read_steps(steps, start, length)
  local fields = {}
  for p = start, start + length - 1 do fields[#fields + 1] = pos_str(p) end
  return hmget_chunked(steps, fields)
end
