-- Insert a batch and evict beyond capacity, atomically.
-- @include common
-- @include masslog
-- @include items
-- @include history
-- @include insert
-- @keys 13
-- @retry remembered
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order (see
-- buffer_keys in _common.lua)
-- ARGV[1] schema (canonical JSON; set by the first add, must match afterwards)
-- ARGV[2] n, the number of items
-- ARGV[3] options: "" or a JSON object read by the parts that need more per batch
-- ARGV[4..] blob_1, log_reward_1, ..., blob_n, log_reward_n  (log-rewards as text; "-inf"
-- and "inf" ok)
-- Evicts (count - capacity) items: the oldest ("fifo"), or the lowest log-reward with the
-- oldest first among equals ("reward", so +inf items go last). New items may be evicted at
-- once under "reward" (see insert_batch in _insert.lua).
-- Returns {first_id, n, evicted}. Errors: RB_NOBUF, RB_SCHEMA, RB_INVALID (a NaN or
-- non-numeric priority), RB_LIMIT (n above RB_MAX_ADD, or more than one item and their
-- blobs above RB_MAX_ADD_BYTES in all, redisbuf/store/bounds.py); nothing is written.
local K = buffer_keys(KEYS)
local conf, err = buffer_config(K)
if err then return err end
local n = tonumber(ARGV[2])
if n == nil or n > RB_MAX_ADD then
  return fail('RB_LIMIT', 'one add stores at most ' .. RB_MAX_ADD .. ' items, got '
    .. tostring(ARGV[2]) .. ' (send several batches)')
end
local options = batch_options(ARGV[3])
local blobs, priorities, bytes = {}, {}, 0
for i = 1, n do
  blobs[i] = ARGV[2 + 2 * i]
  priorities[i] = ARGV[3 + 2 * i]
  bytes = bytes + #(blobs[i] or '')
end
if n > 1 and bytes > RB_MAX_ADD_BYTES then
  return fail('RB_LIMIT', 'one add of more than one item stores at most ' .. RB_MAX_ADD_BYTES
    .. ' bytes of items, got ' .. bytes .. ' (send several batches)')
end
-- check everything before the first write: a script that fails halfway is not undone
err = check_priorities(priorities) or check_schema(conf, ARGV[1], priorities)
if err then return err end
return insert_batch(K, conf, ARGV[1], options, blobs, priorities, nil)
