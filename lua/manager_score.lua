-- One manager request in one step: read the items a worker named, copy them into the
-- manager's buffer (when they live in another buffer), and compute the baseline after
-- the copy, atomically. Replaces an HMGET, an add and baseline.lua (three round trips).
-- @include common
-- @include masslog
-- @include items
-- @include history
-- @include insert
-- @include baseline
-- @keys 15
-- @retry never
-- KEYS[1] .. KEYS[#KEYS - 2] the manager buffer's keys, in BufferKeys.all_keys() order
-- (see buffer_keys in _common.lua), then the source buffer's meta and its items hash (the last two keys;
-- the manager's own meta and items when the worker wrote to the manager's buffer)
-- ARGV[1] strategy  ARGV[2] q  ARGV[3] alpha  ARGV[4] store_locally ("1" / "0")
-- ARGV[5] the batch's smallest finite log-reward, or ""  (as baseline.lua)
-- ARGV[6] "1" = copy the items found into the manager's buffer, "0" = only read them
-- ARGV[7] n  ARGV[8..] id_1, log_reward_1, ..., id_n, log_reward_n (ids as stored, log-
-- rewards as text; a copied item gets its log-reward as priority, as an add would)
-- Items the source no longer holds (evicted since the worker wrote them) are skipped.
-- The copy is an insert with the manager buffer's eviction (insert_batch in _insert.lua)
-- of the source's blobs under the source's schema; the first copy fixes the schema.
-- Returns {baseline_source, baseline_value, positions, blobs}: positions are the 0-based
-- indexes (into the n ids) of the items found, blobs their stored bytes, in that order.
-- Errors: RB_NOBUF (either buffer's meta is gone), RB_SCHEMA (the source's items do not
-- fit the manager's buffer), RB_INVALID (a NaN log-reward); nothing is written then.
local K = buffer_keys(KEYS)
local source_meta, source_items = KEYS[#KEYS - 1], KEYS[#KEYS]
local conf, err = buffer_config(K)
if err then return err end
local n = tonumber(ARGV[7])
local ids, log_rewards = {}, {}
for i = 1, n do
  ids[i] = ARGV[6 + 2 * i]
  log_rewards[i] = ARGV[7 + 2 * i]
end
local found = hmget_chunked(source_items, ids)
local positions, blobs, priorities = {}, {}, {}
for i = 1, n do
  if found[i] then
    positions[#positions + 1] = i - 1
    blobs[#blobs + 1] = found[i]
    priorities[#priorities + 1] = log_rewards[i]
  end
end
if ARGV[6] == '1' and #blobs > 0 then
  local schema = redis.call('HGET', source_meta, 'schema')
  if not schema then
    return fail('RB_NOBUF', 'buffer meta ' .. source_meta .. ' holds no schema')
  end
  -- check everything before the first write: a script that fails halfway is not undone
  err = check_priorities(priorities) or check_schema(conf, schema, priorities)
  if err then return err end
  insert_batch(K, conf, schema, {}, blobs, priorities, nil)
end
local ema = redis.call('HGET', K.meta, 'baseline_ema')
local baseline = baseline_answer(K.meta, K.prio, K.order, conf[1], ema, ARGV[1],
  tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5])
return {baseline[1], baseline[2], positions, blobs}
