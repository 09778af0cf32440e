-- Set PER priorities: one bounded append to the mass log, atomically for the whole call.
-- @include common
-- @include masslog
-- @keys 13
-- @retry never
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order
-- ARGV[1] the ids (k ids; a repeated id: the last wins), either 12 decimal digits each,
--   back to back, or big-endian 64-bit integers, 8 bytes each (binary: told apart by
--   being as long as ARGV[2])  ARGV[2] their priorities: k IEEE 754 doubles, 8 bytes each,
--   big-endian
-- ARGV[3..5] optional ('' or absent: none): the log_epoch, log_version and log_stamp of the
--   caller's replica (redisbuf/sampling/replica.py): when the log was not at that version,
--   the reply also carries the entries after it (masslog_behind), this call's last, so
--   that the replica catches up and applies this change itself.
-- ARGV[6] optional: the position (1 .. k) of the largest priority, as the caller found it.
--   The server then checks the priorities with one byte of each (a first byte below 0x7F
--   is a finite double >= 0 below 2^1008, far above any priority a mass holds) instead of
--   comparing all eight to find the largest; a wrong position raises the running max less
--   (to one of this call's own priorities), never above them.
-- The server does no per-id work (no lookup of the ids, whatever the buffer's size): it
-- checks the lengths, that text ids are digits (binary ones need no check: a number
-- that is no stored item's id is skipped like an evicted one) and that every priority is
-- finite and >= 0 (one pass over the doubles' bytes), raises the running max (meta
-- per_max, what new items get), appends one U entry (text ids) or V entry (binary ids,
-- lua/_masslog.lua) and wakes samplers waiting on the buffer.
-- Replicas apply the entry in order, skipping ids not stored at that point of the log
-- (evicted, removed, never added): that is where "ids no longer stored are skipped"
-- happens, and the caller's replica counts the ids it updated. Only while a MaxHeap /
-- MinHeap selector by priority keeps the priorities in order (meta per_heap) does it also
-- write each id there: O(log n) per id.
-- Returns {log_epoch, log_version before, log_version after, log_stamp before, log_stamp
-- after, entries...}: what a replica at the version before needs to apply this change
-- itself (the versions differ by one when this call's entry is the only change), then,
-- when ARGV[3..5] named a replica not at the version before, the entries after its version
-- (at most one catch-up reply's rows; the replica reads on from where they end) or none
-- when it cannot catch up from the log (it reads everything again).
-- Errors: RB_NOBUF, RB_CONFIG (PER is not on), RB_INVALID (text ids not 12 digits each,
-- the lengths differ, or a priority that is NaN, negative or not finite: nothing is written),
-- RB_LIMIT (more than RB_MAX_ITEMS ids).
local K = buffer_keys(KEYS)
local conf = redis.call('HMGET', K.meta, 'capacity', 'mass', 'log_epoch', 'log_version',
  'log_stamp', 'per_max', 'per_heap', 'log_truth')
if not conf[1] then return fail('RB_NOBUF', 'buffer meta ' .. K.meta .. ' does not exist') end
if conf[2] ~= 'per' or conf[8] ~= '1' then
  return fail('RB_CONFIG', 'buffer ' .. K.meta .. ' has no PER priorities (use PERSampler)')
end
local ids, packed = ARGV[1] or '', ARGV[2] or ''
local binary = #ids == #packed and #ids > 0
local k = binary and #ids / 8 or #ids / 12
if not binary and (k ~= math.floor(k) or string.find(ids, '[^0-9]')) then
  return fail('RB_INVALID', 'the ids are 12 decimal digits each, back to back, or 8-byte '
    .. 'big-endian integers (got ' .. #ids .. ' bytes for ' .. #packed .. ' of priorities)')
end
if k > RB_MAX_ITEMS then
  return fail('RB_LIMIT', 'one command updates at most ' .. RB_MAX_ITEMS .. ' priorities, got '
    .. k .. ' (redisbuf/store/bounds.py)')
end
if #packed ~= 8 * k then
  return fail('RB_INVALID', #packed .. ' bytes of priorities for ' .. k
    .. ' ids (8 bytes each: big-endian IEEE 754 doubles)')
end
local pushed  -- {log_version, log_stamp} after this call's append (masslog_push)
local function reply(entries)
  local after = pushed or redis.call('HMGET', K.meta, 'log_version', 'log_stamp')
  local out = {conf[3] or '', conf[4] or '0', after[1] or '0', conf[5] or '', after[2] or ''}
  for i = 5, #entries do out[#out + 1] = entries[i] end
  return out
end
if k == 0 then return reply({}) end
local top, valid
local hint = tonumber(ARGV[6] or '')
if hint and hint >= 1 and hint <= k and hint == math.floor(hint) then
  top, valid = hint, all_first_bytes_below(packed, 8, 127)
else
  top, valid = largest_double(packed, k)
end
if not valid then  -- the slow path, rare: name the first bad value; -0.0 is 0
  local fixed = {}
  for i = 1, k do
    local value = double_at(packed, 8 * i - 7)
    if value == 0 then
      fixed[i] = string.rep('\0', 8)
    elseif value ~= value or value < 0 or value == math.huge then
      return fail('RB_INVALID', 'priority ' .. (i - 1) .. ' is ' .. fmt(value)
        .. '; priorities must be finite and >= 0')
    else
      fixed[i] = string.sub(packed, 8 * i - 7, 8 * i)
    end
  end
  packed = table.concat(fixed)
  top = largest_double(packed, k)
end
local largest = double_at(packed, 8 * top - 7)
if not conf[6] or largest > tonumber(conf[6]) then
  redis.call('HSET', K.meta, 'per_max', fmt(largest))
end
if conf[7] == '1' or conf[7] == 'b' then  -- the priority heap: each id, O(log n)
  local scored, building = {}, conf[7] == 'b'
  for i = 1, k do
    local id
    if binary then id = id_at(ids, 8 * i - 7) else id = string.sub(ids, 12 * i - 11, 12 * i) end
    -- built: the heap holds exactly the items present (XX); while building, an id the
    -- build has not copied yet is written if stored (the build then keeps it: NX)
    if id and (not building or redis.call('HEXISTS', K.items, id) == 1) then
      scored[#scored + 1] = fmt(double_at(packed, 8 * i - 7))
      scored[#scored + 1] = id
    end
  end
  if #scored > 0 then
    if building then call_chunked('ZADD', K.per_heap, scored)
    else
      for i = 1, #scored, 2 * CHUNK do
        redis.call('ZADD', K.per_heap, 'XX', unpack(scored, i, math.min(i + 2 * CHUNK - 1, #scored)))
      end
    end
  end
end
pushed = masslog_push(K, binary and 'V' or 'U', k, ids, packed)
notify_changed(K.meta)  -- a sampler blocked on zero mass wakes (redisbuf/sampling/waiting.py)
if ARGV[3] and ARGV[3] ~= '' and not (ARGV[3] == conf[3] and ARGV[4] == conf[4] and ARGV[5] == conf[5]) then
  return reply(masslog_behind(K, ARGV[3], tonumber(ARGV[4]) or 0, ARGV[5] or ''))
end
return reply({})
