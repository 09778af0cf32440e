-- Swap a restore's staged content in place of a buffer's, atomically: readers see the
-- old buffer or the restored one, never a part. Counters are derived here.
-- @include common
-- @include masslog
-- @include items
-- @keys 28
-- @retry remembered
-- KEYS[1] meta  KEYS[1..m] the buffer's keys (BufferKeys.all_keys(), meta first)
-- KEYS[m+1..2m] the staged keys in the same order (StagingKeys.all_keys()), filled by add.lua
--   and restore_items.lua  KEYS[2m+1] the buffer's snapshot (rb:{name}:snap)
-- KEYS[2m+2] the staged snapshot: under PER, the restored items' priorities, written by
--   the loading process (redisbuf/sampling/replica.py snapshot_fields, header apart)
-- ARGV[1] inserted count from the file (an integer >= 0; raised to the length if below)
-- ARGV[2] sampled count from the file  ARGV[3] schema JSON, or "" to keep the buffer's
-- ARGV[4] "1" when the staged items carry PER priorities, else "0"
-- ARGV[5] the largest staged use count (0 when none)
-- ARGV[6..8] under PER: the staged snapshot's item count, its largest priority, and its
--   header (JSON) but for epoch, version and stamp, which the swap fills in
-- Every data key of the buffer is replaced by its staged twin (deleted if there is none):
-- the old key is UNLINKed (freed in the background) and the staged one RENAMEd onto the
-- free name, O(1) each; nothing here iterates the items (redisbuf/store/bounds.py), the
-- sums coming from the staged meta (restore_items.lua). Meta keeps its configuration and
-- gets inserted, evicted = inserted - length, sampled, and last_id = the larger of both
-- (ids are never reused), present_uses = the sum of the staged use counts. Under PER
-- (meta mass = per) every staged item carries a priority (its saved one, else
-- per_initial as restore_stage.lua found it: the new-item rule, nothing else being
-- present), in the staged snapshot, which becomes the buffer's snapshot at version 1 of
-- the new epoch (the priorities are the snapshot and the log after it); the running max
-- is the staged one; the staged heap of priorities, when the staged meta keeps one (its
-- remover reads it), is the buffer's. With prioritized sampling (or PER) the mass log
-- starts a new epoch, so every sampler's replica reads the restored content. The staged
-- keys are gone afterwards.
-- Returns the new length. Errors (checked before any write): RB_NOBUF (the buffer was
-- dropped), RB_CONFIG (the staged keys are missing or were made for another capacity;
-- staged PER priorities for a buffer without PER; the buffer's PER setting is not the one
-- the items were staged for; a use count at or over max_use).
refuse_while_applying(KEYS[1])  -- before any write: a large add is stored first
local m = (#KEYS - 2) / 2
local snap, staged_snap = KEYS[2 * m + 1], KEYS[2 * m + 2]
local meta, staged_meta = KEYS[1], KEYS[m + 1]
local conf = redis.call('HMGET', meta, 'capacity', 'last_id', 'masslog', 'mass', 'max_use',
  'per_initial')
if not conf[1] then return fail('RB_NOBUF', 'buffer meta ' .. meta .. ' does not exist') end
local staged = redis.call('HMGET', staged_meta, 'capacity', 'last_id', 'per_heap')
if staged[1] ~= conf[1] then
  return fail('RB_CONFIG', 'staged restore ' .. staged_meta .. ' is missing or does not fit')
end
local per = conf[4] == 'per'
if ARGV[4] == '1' and not per then
  return fail('RB_CONFIG', 'the saved items carry PER priorities and buffer ' .. meta
    .. ' does not use PER (PERSampler)')
end
if conf[5] and tonumber(ARGV[5]) >= tonumber(conf[5]) then
  return fail('RB_CONFIG', 'a saved item was sampled ' .. ARGV[5] .. ' times, at or over'
    .. ' max_use=' .. conf[5] .. ' of buffer ' .. meta)
end
-- The use counts' sums restore_items.lua kept per call of the staged items: a field per
-- thousand items, so that nothing below iterates the items themselves.
local used = 0
local sums = redis.call('HGETALL', staged_meta)
for i = 1, #sums, 2 do
  if string.sub(sums[i], 1, 5) == 'uses:' then used = used + tonumber(sums[i + 1]) end
end
local count, top = tonumber(ARGV[6]) or 0, tonumber(ARGV[7])
local staged_keys = {}
for i = 1, m do staged_keys[i] = KEYS[m + i] end
local length = redis.call('ZCARD', buffer_keys(staged_keys).order)
if per ~= (redis.call('HEXISTS', staged_meta, 'per_default') == 1)
    or (per and (count ~= length or redis.call('EXISTS', staged_snap) == 0)) then
  return fail('RB_CONFIG', 'staged restore ' .. staged_meta .. ' has PER priorities for '
    .. count .. ' of its ' .. length .. ' items (the buffer\'s PER setting changed during the '
    .. 'load); load again')
end
-- O(1) per key: the old content is unlinked (freed in the background), then the staged
-- key renamed onto the now absent name
for i = 2, m do
  redis.call('UNLINK', KEYS[i])
  if redis.call('EXISTS', KEYS[m + i]) == 1 then
    redis.call('RENAME', KEYS[m + i], KEYS[i])
    redis.call('PERSIST', KEYS[i])  -- staged keys expire if their load dies (checkpoint.py)
  end
end
redis.call('UNLINK', staged_meta)
local K = buffer_keys(KEYS, true)  -- (checked at the top)
length = redis.call('ZCARD', K.order)
local inserted = math.max(tonumber(ARGV[1]), length)
local last = math.max(tonumber(conf[2] or '0'), tonumber(staged[2] or '0'))
redis.call('HSET', meta, 'inserted', string.format('%.0f', inserted),
  'evicted', string.format('%.0f', inserted - length), 'sampled', ARGV[2],
  'last_id', string.format('%.0f', last), 'reset_through', string.format('%.0f', last),
  'present_uses', string.format('%.0f', used))
redis.call('HDEL', meta, 'per_sum', 'per_comp', 'per_nonzero', 'per_max', 'per_heap',
  'per_legacy')
-- a remover by priority reads the heap: the loader filled the staged one (restore_stage.lua)
if per and staged[3] == '1' then redis.call('HSET', meta, 'per_heap', '1') end
if ARGV[3] ~= '' then
  redis.call('HSET', meta, 'schema', ARGV[3], 'kind', cjson.decode(ARGV[3])['kind'], 'rewards',
    schema_rewards(ARGV[3]))
end
if per and top ~= nil then per_raise_max(K, top) end
if per or conf[3] == '1' then  -- every replica reads the restored content
  redis.call('HSET', meta, 'masslog', '1')
  masslog_reset(K)
end
redis.call('UNLINK', snap)
if per then  -- the restored priorities: the new epoch's snapshot, as of its first entry
  local log = redis.call('HMGET', meta, 'log_epoch', 'log_version', 'log_stamp')
  local header = cjson.decode(ARGV[8])
  header['epoch'], header['version'], header['stamp'] = log[1], tonumber(log[2]), log[3]
  redis.call('HSET', staged_snap, 'header', cjson.encode(header))
  redis.call('RENAME', staged_snap, snap)
  redis.call('PERSIST', snap)
  redis.call('HSET', meta, 'log_truth', '1', 'snap_epoch', log[1], 'snap_version', log[2])
  redis.call('HDEL', meta, 'per_base')  -- the snapshot is this epoch's base
end
redis.call('UNLINK', staged_snap)
return length
