-- Commit a prioritized draw made by a sampling process from its replica of the buffer's
-- scores (redisbuf/replica.py): check that the replica was current, record the draws and
-- optionally return the blobs, in one atomic call. The same script serves softmax of
-- log-rewards and PER: the replica applies the mass rule, the server only checks versions.
-- @include common
-- @include masslog
-- @include items
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order
-- ARGV[1] "softmax" or "per" (the rule the replica drew by)  ARGV[2] its log_epoch
-- ARGV[3] its log_version  ARGV[4] "exact": the draw stands only if no change was logged
-- since that version (the draw then follows every change made before this call);
-- "present": the draw stands if its items are all still present (for a replica brought up
-- to date after the sample began, by this script's previous reply or by reading the
-- buffer: the draw follows every change made before the sample began)
-- ARGV[5] "1" = also return blobs  ARGV[6..] the drawn ids (12-digit; may repeat)
-- Returns {1, length, per_sum, per_nonzero, blob_1..blob_n (if asked)} when the draw
-- stands (per_sum / per_nonzero: the mean non-zero PER priority), else the replica's
-- catch-up (masslog_behind): {0, epoch, version, first, entries...}.
-- Errors: RB_NOTREE (prioritized sampling, or PER for "per", is not on), RB_CONFIG (the
-- buffer samples by the other rule).
local K = buffer_keys(KEYS)
local conf = redis.call('HMGET', K.meta, 'tree', 'tree_mass', 'log_epoch', 'log_version',
  'per_sum', 'per_comp', 'per_nonzero')
local per = conf[2] == 'per'
if conf[1] ~= '1' or (ARGV[1] == 'per' and not per) then
  if ARGV[1] == 'per' then return fail('RB_NOTREE', 'prioritized experience replay is not enabled') end
  return fail('RB_NOTREE', 'prioritized sampling is not enabled')
end
if ARGV[1] ~= 'per' and per then
  return fail('RB_CONFIG', 'buffer ' .. K.meta .. ' samples by PER priorities'
    .. ' (PERSampler), not by log-rewards')
end
local have = tonumber(ARGV[3])
if conf[3] ~= ARGV[2] or (ARGV[4] == 'exact' and conf[4] ~= ARGV[3]) then
  return masslog_behind(K, ARGV[2], have)
end
local ids = {}
for i = 6, #ARGV do ids[#ids + 1] = ARGV[i] end
if ARGV[4] ~= 'exact' then
  local present = zmscore_chunked(K.order, ids)
  for i = 1, #ids do
    if not present[i] then return masslog_behind(K, ARGV[2], have) end
  end
end
local sum = (tonumber(conf[5]) or 0) + (tonumber(conf[6]) or 0)
local out = {1, redis.call('ZCARD', K.order), fmt(sum), conf[7] or '0'}
if ARGV[5] == '1' then
  local blobs = hmget_chunked(K.items, ids)
  for i = 1, #ids do out[4 + i] = blobs[i] end
end
record_draws(K, ids)  -- after reading the blobs: it may remove used-up items
return out
