-- Store a batch whose ids lua/add_reserve.lua reserved and whose blobs a native HSET
-- wrote into the items hash just before this script, in the same MULTI/EXEC (the second
-- call of ReplayBuffer.add, redisbuf/buffers/replay.py): the blobs never pass through Lua, and
-- no reader sees them before this script has stored the rest of the batch.
-- @include common
-- @include masslog
-- @include items
-- @include history
-- @include insert
-- @keys 13
-- @retry remembered
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order (see
-- buffer_keys in _common.lua)
-- ARGV[1] schema (canonical JSON)  ARGV[2] first_id  ARGV[3] n
-- ARGV[4] options: "" or a JSON object (see insert_batch in _insert.lua)
-- ARGV[5..4+n] log_reward_1 .. log_reward_n (text; "-inf" and "inf" ok)
-- Stores and evicts as add.lua (commit_batch in _insert.lua); the batch was admitted when
-- its ids were reserved. Returns {first_id, n, evicted}.
-- Errors: RB_NOBUF, RB_SCHEMA (another process fixed another schema since the
-- reservation), RB_INVALID, RB_CONFIG: the batch's blobs are deleted and its ids given
-- back (last_id -= n) unless a later batch reserved ids since, so the buffer is as it was
-- (apart from that gap in the ids).
-- Blobs in the items hash that no item owns (blobs of a transaction whose script never
-- ran: NOSCRIPT, then the writer died before its retry) are deleted here, found by
-- HLEN items exceeding ZCARD order + n (O(1); the search is O(length), and rare), by a
-- caller allowed to read the items.
local K = buffer_keys(KEYS)
local first, n = tonumber(ARGV[2]), tonumber(ARGV[3])
local ids = id_range(first, n)
local options = batch_options(ARGV[4])
local priorities = {}
for i = 1, n do priorities[i] = ARGV[4 + i] end

local function refuse(reply)
  call_chunked('HDEL', K.items, ids)
  local last = redis.call('HGET', K.meta, 'last_id')
  if last and tonumber(last) == first + n - 1 then
    redis.call('HINCRBY', K.meta, 'last_id', -n)
  end
  return reply
end

local conf, err = buffer_config(K)
if err then return refuse(err) end
err = check_priorities(priorities) or check_schema(conf, ARGV[1], priorities)
if err then return refuse(err) end
-- PER may have been switched on or off since the reservation: check before any write
local ok, problem = pcall(per_batch_priorities, K, n, options)
if not ok then return refuse(redis.error_reply(tostring(problem))) end
-- the search reads the items hash: a caller that may only write it (the actor role of
-- redisbuf/ops/acl.py) leaves the orphans to the next caller that may read it
if redis.call('HLEN', K.items) > redis.call('ZCARD', K.order) + n
    and (not redis.acl_check_cmd or redis.acl_check_cmd('HKEYS', K.items)) then
  drop_orphans(K, ids)
end
return commit_batch(K, conf, ARGV[1], options, ids, first, nil, priorities, nil)
