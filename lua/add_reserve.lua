-- Reserve the ids of a batch that lua/add_commit.lua then stores: the first of the two
-- calls of ReplayBuffer.add (redisbuf/buffers/replay.py, ReplayBuffer._insert).
-- @include common
-- @include masslog
-- @include items
-- @include history
-- @include insert
-- @keys 13
-- @retry remembered
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order (see
-- buffer_keys in _common.lua)
-- ARGV[1] schema (canonical JSON)  ARGV[2] n, the number of items
-- ARGV[3] options: "" or a JSON object (see insert_batch in _insert.lua)
-- ARGV[4..3+n] log_reward_1 .. log_reward_n (text; "-inf" and "inf" ok)
-- Checks what add.lua checks before its first write (schema, log-rewards, PER
-- priorities only on a buffer with PER), then asks admit_batch; an admitted batch gets n
-- fresh ids (last_id += n).
-- Returns {first_id, n}, or {0, 0, 0, reason} when admit_batch refuses the batch (only
-- its counter is written). Errors: RB_NOBUF, RB_SCHEMA, RB_INVALID, RB_CONFIG, RB_LIMIT
-- (n above RB_MAX_ADD, redisbuf/store/bounds.py; nothing is written).
local K = buffer_keys(KEYS)
local conf, err = buffer_config(K)
if err then return err end
local n = tonumber(ARGV[2])
if n == nil or n > RB_MAX_ADD then
  return fail('RB_LIMIT', 'one add stores at most ' .. RB_MAX_ADD .. ' items, got '
    .. tostring(ARGV[2]) .. ' (send several batches)')
end
local options = batch_options(ARGV[3])
local priorities = {}
for i = 1, n do priorities[i] = ARGV[3 + i] end
err = check_priorities(priorities) or check_schema(conf, ARGV[1], priorities)
if err then return err end
-- PER priorities given to a buffer without PER: refused here, before any blob is sent
-- (the commit refuses them too, deleting the blobs, should PER change in between)
if options and options.per_priorities and not per_enabled(K) then
  return fail('RB_CONFIG', 'buffer ' .. K.meta .. ' has no PER priorities: priorities= '
    .. 'needs PERSampler')
end
local first, refused = reserve_ids(K, n, options)
if refused then return {0, 0, 0, refused} end
return {first, n}
