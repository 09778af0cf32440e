-- How a replica's first read of a buffer's scores goes (redisbuf/sampling/replica.py,
-- MassReplica.load), when it has no snapshot to read: the replica then reads the scores
-- itself with native commands of bounded cost (HMGET of a slice of ids, or a SCAN step),
-- not through a script, so the server does no per-item Lua work and the replies come
-- straight to numpy. Keeps the log's entries after the pinned version for the next
-- ARGV[1] milliseconds (masslog_pin): the replica applies them afterwards, however fast
-- the writers are meanwhile. The replica calls this again to renew the pin while it reads.
-- @include common
-- @include masslog
-- @keys 13
-- @retry never
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order
-- ARGV[1] pin milliseconds  ARGV[2] the version pinned (the log_version read before)
-- ARGV[3] optional: the reader's token (letters and digits; the version when absent):
--   its pin replaces its earlier one, other readers' pins stay (masslog_pin)
-- Returns {how, key, ...}:
--   {'base', order, priority, stamp}: PER with no snapshot of this epoch (the replica
--     tried it first): the epoch's first entry (its X, version 1; stamp: its stamp, ''
--     when the log no longer holds it) gave every item present then `priority` (meta
--     per_base, the initial priority when PER was turned on; any priority after a clear,
--     none being present): ZSCAN the key for the ids present, give each that priority
--     and apply the log from version 1 (pin version 1); stamp '' too for an epoch that
--     began with its snapshot (a load: no per_base), which then is its only base
--   {'ids', per, first, last, stamp}: PER of the earlier layout (meta per_legacy: the epoch's
--     base is the per hash, which nothing writes any more), ids dense enough to ask for:
--     HMGET key for every id first .. last (the oldest item present and the last id
--     given; "%012d"; nil for an id not present), each value a priority; then, as for
--     'base', the log from version 1 (stamp: the last element)
--   {'hash', per, stamp}: the same, HSCAN the key (field: the id, value: its priority)
--   {'zset', prio}: softmax, ZSCAN the key (member: the id, score: its log-reward)
--   {'zero', order}: softmax with no log-rewards stored, ZSCAN the key for the ids (every
--     log-reward is 0)
-- Every item present from the pinned version to the end of the read comes (a SCAN may
-- return one twice); one added, changed or removed meanwhile may come either way: the
-- entries after the pinned version set it right. Read-only but for the pin.
-- Errors: RB_NOLOG (prioritized sampling is off),
--   RB_INVALID (a pin holder not of letters and digits).
local K = buffer_keys(KEYS)
if not masslog_on(K) then return fail('RB_NOLOG', 'prioritized sampling is not enabled') end
local bad = bad_holder(ARGV[3])
if bad then return bad end
masslog_pin(K, tonumber(ARGV[2]), tonumber(ARGV[1]), ARGV[3])
local conf = redis.call('HMGET', K.meta, 'mass', 'per_legacy', 'per_base', 'per_initial',
  'log_first')
local stamp = ''  -- PER: the stamp of the epoch's first entry, where the base is as of
if conf[5] == '1' then stamp = entry_stamp(redis.call('LINDEX', K.masslog, 0)) end
if conf[1] == 'per' and conf[2] ~= '1' then
  -- no per_base: the epoch began with its snapshot (a load), which is the only base
  if not conf[3] then stamp = '' end
  return {'base', K.order, conf[3] or conf[4] or '1', stamp}
elseif conf[1] == 'per' then
  local count = redis.call('HLEN', K.per)
  local oldest = redis.call('ZRANGE', K.order, 0, 0)[1]
  local last = tonumber(redis.call('HGET', K.meta, 'last_id'))
  if oldest and last and last < 1e12 then
    local first = tonumber(oldest)
    -- an HMGET costs the server about 2/3 of what a SCAN step does per item returned
    -- (measured at 2x10^6 items): ask by id unless the range is half holes or more
    if last - first + 1 <= count * 1.5 then
      return {'ids', K.per, first, last, stamp}
    end
  end
  return {'hash', K.per, stamp}
elseif rewards_kept(K) then
  return {'zset', K.prio}
end
return {'zero', K.order}
