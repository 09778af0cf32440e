-- Store one episode (its steps, in order) as one unit, then evict whole episodes, oldest
-- first, while more than `capacity` are stored.
-- @include common
-- @include episodes
-- @include history
-- @keys 4
-- @retry never
-- KEYS[1] meta  KEYS[2] index  KEYS[3] lens  KEYS[4] steps
-- ARGV[1] the episode's schema text (the first push fixes the buffer's; later pushes must
-- match it)  ARGV[2..] the episode's step blobs, in order
-- Counts episodes in meta "pushed" and "evicted", and records the rate history
-- (_history.lua) from "pushed", "evicted", "sampled": units are episodes (sampled counts
-- draws: an episode of sample_episodes or a window of sample_windows each).
-- Returns {episode id, position of its first step, episodes evicted}.
-- Errors: RB_NOBUF (meta missing), RB_SCHEMA (another schema), RB_INVALID (no steps).
local meta, index, lens, steps = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local capacity = tonumber(redis.call('HGET', meta, 'capacity'))
if not capacity then return fail('RB_NOBUF', 'episode buffer meta ' .. meta .. ' does not exist') end
local length = #ARGV - 1
if length < 1 then return fail('RB_INVALID', 'an episode needs at least one step') end
local schema = redis.call('HGET', meta, 'schema')
if schema and schema ~= ARGV[1] then
  return fail('RB_SCHEMA', 'episode schema ' .. ARGV[1] .. ' differs from the buffer\'s ' .. schema)
end
if not schema then redis.call('HSET', meta, 'schema', ARGV[1]) end
local id = id_str(redis.call('HINCRBY', meta, 'last_id', 1))
local start = tonumber(redis.call('HGET', meta, 'next_pos'))
local fields = {}
for i = 1, length do
  fields[2 * i - 1] = pos_str(start + i - 1)
  fields[2 * i] = ARGV[i + 1]
end
call_chunked('HSET', steps, fields)
redis.call('ZADD', index, pos_str(start), id)
redis.call('HSET', lens, id, length)
local live = tonumber(redis.call('HGET', meta, 'steps')) + length
local evicted = 0
while redis.call('ZCARD', index) > capacity do
  live = live - evict_oldest_episode(meta, index, lens, steps)
  evicted = evicted + 1
end
redis.call('HSET', meta, 'next_pos', pos_str(start + length), 'steps', live)
redis.call('HINCRBY', meta, 'pushed', 1)
redis.call('HINCRBY', meta, 'evicted', evicted)
record_history(meta, {'pushed', 'evicted', 'sampled'})
return {id, start, evicted}
