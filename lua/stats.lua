-- A buffer's configuration and counters, for clients without redisbuf (ReplayBuffer.stats
-- in Python reads the same hash and adds what it computes itself).
-- @keys 2
-- @retry never
-- KEYS[1] meta  KEYS[2] order
-- Returns {field_1, value_1, ...}: every field of the meta hash (capacity, eviction,
-- schema, kind, last_id, inserted, evicted, sampled, ...; the rate history "hist:*" left
-- out), then "length" and the number of items present. Reads only (no-writes).
-- Errors: RB_NOBUF (no buffer of that name).
-- @include common
refuse_while_applying(KEYS[1])  -- counters mid-way through a large add: none
local meta = redis.call('HGETALL', KEYS[1])
if #meta == 0 then return fail('RB_NOBUF', 'buffer meta ' .. KEYS[1] .. ' does not exist') end
local out = {}
for i = 1, #meta, 2 do
  if string.sub(meta[i], 1, 5) ~= 'hist:' then
    out[#out + 1] = meta[i]
    out[#out + 1] = meta[i + 1]
  end
end
out[#out + 1] = 'length'
out[#out + 1] = tostring(redis.call('ZCARD', KEYS[2]))
return out
