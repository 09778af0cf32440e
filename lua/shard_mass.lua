-- What drawing across the shards of a sharded buffer needs to know of one shard
-- (redisbuf/sharded.py): its size and its total softmax mass, read together.
-- @include common
-- @include tree
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order (see
-- buffer_keys in _common.lua)
-- No ARGV.
-- Returns {length, drawable, infinite, log_mass}: the items held (ZCARD order), those of
-- finite log-reward (nonzero softmax mass), those of log-reward +inf, and the natural log
-- of the sum of exp(log_reward) over the items as text ("-inf" when there is no mass):
-- the sum tree's root plus its reference tree_ref (the tree keeps exp(log_reward - ref)).
-- Errors: RB_NOTREE (prioritized sampling is not enabled).
local K = buffer_keys(KEYS)
local conf = redis.call('HMGET', K.meta, 'tree', 'tree_ref')
if conf[1] ~= '1' then return fail('RB_NOTREE', 'prioritized sampling is not enabled') end
local length = redis.call('ZCARD', K.order)
local infinite = infinite_count(K.prio)
local zero = redis.call('ZCOUNT', K.prio, '-inf', '-inf')
local root = redis.call('HGET', K.tree, 0)
local total = root and chunk_sum(root) or 0
local log_mass = '-inf'
if total > 0 then log_mass = fmt(math.log(total) + (tonumber(conf[2]) or 0)) end
return {length, redis.call('ZCARD', K.prio) - zero - infinite, infinite, log_mass}
