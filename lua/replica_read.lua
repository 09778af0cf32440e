-- One slice of a replica's first read of a buffer's scores (redisbuf/sampling/replica.py,
-- MassReplica.load): a SCAN step over the per hash (PER) or the prio zset (softmax),
-- packed into two texts, so a replica of millions of items reads in a few dozen calls of
-- bounded cost and parses with numpy. Keeps the log's entries after the pinned version
-- for the next ARGV[3] milliseconds (masslog_pin): the replica applies them afterwards,
-- however fast the writers are meanwhile.
-- @include common
-- @include masslog
-- @keys 13
-- @retry never
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order
-- ARGV[1] the SCAN cursor ("0" to start)  ARGV[2] COUNT  ARGV[3] pin milliseconds
-- ARGV[4] the version pinned (the log_version read before the first slice)
-- Returns {next cursor, ids (comma-separated), scores (comma-separated)}; the read is done
-- when the cursor is "0". An item may come twice, and one added or removed meanwhile may
-- or may not come: the entries after the pinned version set it right. Read-only but for
-- the pin. Errors: RB_NOLOG (prioritized sampling is off).
local K = buffer_keys(KEYS)
if not masslog_on(K) then return fail('RB_NOLOG', 'prioritized sampling is not enabled') end
masslog_pin(K, tonumber(ARGV[4]), tonumber(ARGV[3]))
local ids, scores = {}, {}
local reply
if redis.call('HGET', K.meta, 'mass') == 'per' then
  reply = redis.call('HSCAN', K.per, ARGV[1], 'COUNT', ARGV[2])
elseif rewards_kept(K) then
  reply = redis.call('ZSCAN', K.prio, ARGV[1], 'COUNT', ARGV[2])
else  -- no log-rewards stored: every item's is 0
  reply = redis.call('ZSCAN', K.order, ARGV[1], 'COUNT', ARGV[2])
  for i = 2, #reply[2], 2 do reply[2][i] = '0' end
end
local flat = reply[2]
for i = 1, #flat, 2 do
  ids[#ids + 1] = flat[i]
  scores[#scores + 1] = flat[i + 1]
end
return {reply[1], table.concat(ids, ','), table.concat(scores, ',')}
