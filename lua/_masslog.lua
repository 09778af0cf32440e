-- The mass log, a helper scripts name with "-- @include masslog".
-- Prioritized sampling (softmax of log-rewards, or PER) draws in the sampling processes,
-- each from its own replica of the items' scores (redisbuf/sampling/replica.py). For
-- softmax the server keeps the truth (the prio zset) and, while prioritized sampling is on
-- (meta masslog = 1), this log of every change to it, appended by the same script that
-- makes the change, so a replica catches up by reading the entries after the version it
-- has. Under PER (meta log_truth = 1) the server keeps no per-item priority at all: the
-- priorities are the newest snapshot (rb:{name}:snap, written by a following replica) and
-- this log after it, which is therefore trimmed only behind that snapshot. Writing a
-- change costs one RPUSH whatever the buffer's size.
--
-- The masslog list holds the newest entries, one per script that changed scores:
--   "C|k|stamp|ids|old|new"  k rows: ids (decimal, comma-separated); each one's score
--                     before the change and after it (log-rewards under softmax, PER
--                     priorities under PER; "nan" for not present), comma-separated. Under
--                     PER old is empty (not logged). An empty old otherwise means all were
--                     absent (an add); an empty new, all are removed; a new of one value
--                     when k > 1, all get that value. An id may appear in several rows:
--                     they apply in order. C entries set what they name: a row's new
--                     score holds whether the id was present before or not.
--   "U|k|stamp|IP"    a PER priority update (lua/update_priority.lua): I, k ids of 12
--                     digits each back to back; P, right after them, their priorities as
--                     k IEEE 754 doubles, 8 bytes each, big-endian (binary). Each applies
--                     only to an id stored at that point of the log (an id evicted
--                     before, or never added, is skipped); the last of a repeated id wins.
--   "V|k|stamp|IP"    the same, I being k ids as big-endian 64-bit integers, 8 bytes
--                     each (binary: no id is checked, as any that is not stored is
--                     skipped; see id_at)
--   "P|k|stamp|ids|new|old"  (written by earlier versions) a priority change of k ids
--                     present, 12 digits each; new as in C; old as 16 hex digits each.
--   "X|0|stamp"       everything changed (turned on, cleared, restored): read it all again
-- The stamp (server time and version) differs between two histories, so a replica that
-- finds another stamp at its version (the server restarted from an older state, or a
-- failover lost writes) reads everything again.
-- Meta: log_epoch (changes with every X), log_version (entries ever appended since that
-- epoch; the last entry's version), log_first (the version of the list's first entry),
-- log_ids (rows held), log_stamp (the last entry's stamp), log_pins (the pins of the
-- replicas reading the whole buffer or a snapshot, each kept apart: see masslog_pin),
-- log_truth (1: PER, the log and the snapshot are the priorities). The oldest entries are
-- dropped while the list holds more than max(MASSLOG_MIN_IDS, capacity / 4) rows (and
-- none is pinned; under log_truth, only entries before the snapshot's version of this
-- epoch): a replica further behind reads everything again.
-- @include common
local MASSLOG_MIN_IDS = 10000
-- A reply never carries more than this many rows of entries (a replica further behind
-- asks again), so no call's work grows with how far behind a replica is.
local MASSLOG_REPLY_ROWS = 20000
local MASSLOG_REPLY_ENTRIES = 256

local function masslog_on(K)
  return redis.call('HGET', K.meta, 'masslog') == '1'
end

local function server_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end

local function new_stamp(version)
  local now = redis.call('TIME')
  return now[1] .. string.format('%06d', now[2]) .. '.' .. version
end

-- Start a new log (a new epoch) with one X entry: every replica reads everything again.
-- The old list is unlinked (freed in the background, however long it was).
local function masslog_reset(K)
  local now = redis.call('TIME')
  local stamp = new_stamp(1)
  redis.call('UNLINK', K.masslog)
  redis.call('RPUSH', K.masslog, 'X|0|' .. stamp)
  redis.call('HSET', K.meta, 'log_epoch', now[1] .. string.format('%06d', now[2]),
    'log_version', 1, 'log_first', 1, 'log_ids', 0, 'log_stamp', stamp)
  -- log_pin / log_pin_until: the one shared pin of earlier versions
  redis.call('HDEL', K.meta, 'log_pins', 'log_pin', 'log_pin_until')
end

-- The pins in meta log_pins: "holder=version@until" joined by ';', one per reader (a
-- token it names itself by): the entries after `version` are kept for it until `until`
-- (server milliseconds). As {holder, version, until} tables.
local function pins_of(text)
  local pins = {}
  if text then
    for holder, version, till in string.gmatch(text, '([^;=]+)=([^;@]+)@([^;]+)') do
      pins[#pins + 1] = {holder, tonumber(version), tonumber(till)}
    end
  end
  return pins
end

-- Write back the pins of log_pins but `holder`'s and the expired ones, then `extra` (a
-- pin, or nil); the field goes when none is left.
local function pins_keep(K, holder, now, extra)
  local parts = {}
  for _, pin in ipairs(pins_of(redis.call('HGET', K.meta, 'log_pins'))) do
    if pin[3] >= now and pin[1] ~= holder then
      parts[#parts + 1] = pin[1] .. '=' .. pin[2] .. '@' .. pin[3]
    end
  end
  if extra then parts[#parts + 1] = extra[1] .. '=' .. extra[2] .. '@' .. extra[3] end
  if #parts == 0 then
    redis.call('HDEL', K.meta, 'log_pins')
  else
    redis.call('HSET', K.meta, 'log_pins', table.concat(parts, ';'))
  end
end

-- An error reply when `holder` (a pin's reader token) is not letters and digits, else nil.
local function bad_holder(holder)
  if holder and not string.match(holder, '^%w+$') then
    return fail('RB_INVALID', 'a pin holder is letters and digits, got ' .. tostring(holder))
  end
  return nil
end

-- The rows of an entry, as text: list joined by commas; nil -> '' (all absent / removed).
local function joined(list)
  if list == nil then return '' end
  return table.concat(list, ',')
end

-- Append one entry of kind `kind` ("C", "U" or "V") with `rows` rows (at least one), its
-- fields after the stamp the strings `...` back to back (joined once: an entry is a few
-- KiB), while prioritized sampling is on (the caller checks masslog_on before it builds
-- the body); a change of more rows than one reply may carry starts a new epoch instead
-- (every replica reads everything again, in slices of bounded cost). Returns {the log's
-- version, its stamp} after the append, or nil after a new epoch.
local function masslog_push(K, kind, rows, ...)
  -- more than one reply carries: read everything again (not under log_truth, where the
  -- log is the priorities: such an entry is one reply on its own; no bounded command
  -- writes one)
  if rows > MASSLOG_REPLY_ROWS and redis.call('HGET', K.meta, 'log_truth') ~= '1' then
    masslog_reset(K)
    return nil
  end
  local conf = redis.call('HMGET', K.meta, 'log_version', 'log_first', 'log_ids', 'capacity',
    'log_pins', 'log_truth', 'snap_epoch', 'snap_version', 'log_epoch')
  if not conf[1] then  -- no log yet (turned on by hand): start one
    masslog_reset(K)
    conf = redis.call('HMGET', K.meta, 'log_version', 'log_first', 'log_ids', 'capacity',
      'log_pins', 'log_truth', 'snap_epoch', 'snap_version', 'log_epoch')
  end
  local version, first = tonumber(conf[1]) + 1, tonumber(conf[2])
  local held = tonumber(conf[3]) + rows
  local stamp = new_stamp(version)
  local length = redis.call('RPUSH', K.masslog, table.concat({kind, '|', rows, '|', stamp, '|', ...}))
  local limit = math.max(MASSLOG_MIN_IDS, math.floor((tonumber(conf[4]) or 0) / 4))
  local pin = nil  -- the lowest version a live pin keeps the entries after
  if conf[5] then
    local now = server_ms()
    for _, held in ipairs(pins_of(conf[5])) do
      if held[3] >= now and (pin == nil or held[2] < pin) then pin = held[2] end
    end
  end
  if conf[6] == '1' then  -- the log holds the priorities after the snapshot: keep them
    local covered = conf[7] == conf[9] and tonumber(conf[8]) or 0
    if pin == nil or covered < pin then pin = covered end
  end
  while held > limit and length > 1 and (pin == nil or first < pin) do
    local oldest = redis.call('LPOP', K.masslog)
    local bar = string.find(oldest, '|', 3, true)
    held = held - tonumber(string.sub(oldest, 3, bar - 1))
    first = first + 1
    length = length - 1
  end
  redis.call('HSET', K.meta, 'log_version', version, 'log_first', first, 'log_ids', held,
    'log_stamp', stamp)
  return {tostring(version), stamp}
end

-- Append one C entry for rows ids (strings) with old and new scores (lists of text, or
-- nil: all absent / all removed; new may hold one value for all). No-op without rows or
-- while prioritized sampling is off.
local function masslog_append(K, ids, old, new)
  if #ids == 0 or not masslog_on(K) then return end
  masslog_push(K, 'C', #ids, table.concat(ids, ',') .. '|' .. joined(old) .. '|' .. joined(new))
end

-- The number whose IEEE 754 bits `hex` spells: 16 hex digits, big-endian (a P entry's old
-- scores). Exact: the mantissa fits a double and the scaling is by a power of two.
local function number_of_bits(hex)
  local high = tonumber(string.sub(hex, 1, 8), 16)
  local low = tonumber(string.sub(hex, 9, 16), 16)
  local sign = 1
  if high >= 2147483648 then sign, high = -1, high - 2147483648 end
  local exponent = math.floor(high / 1048576)
  local mantissa = (high % 1048576) * 4294967296 + low
  if exponent == 2047 then
    if mantissa == 0 then return sign * math.huge end
    return 0 / 0
  end
  if exponent == 0 then return sign * mantissa * 2 ^ -1074 end
  return sign * (mantissa + 4503599627370496) * 2 ^ (exponent - 1075)
end

-- The IEEE 754 double whose 8 bytes, big-endian, start at position i of s (a U entry's
-- priorities). Exact, as number_of_bits.
local function double_at(s, i)
  local b1, b2, b3, b4, b5, b6, b7, b8 = string.byte(s, i, i + 7)
  local sign = 1
  if b1 >= 128 then sign, b1 = -1, b1 - 128 end
  local exponent = b1 * 16 + math.floor(b2 / 16)
  local mantissa = ((((((b2 % 16) * 256 + b3) * 256 + b4) * 256 + b5) * 256 + b6) * 256
    + b7) * 256 + b8
  if exponent == 2047 then
    if mantissa == 0 then return sign * math.huge end
    return 0 / 0
  end
  if exponent == 0 then return sign * mantissa * 2 ^ -1074 end
  return sign * (mantissa + 4503599627370496) * 2 ^ (exponent - 1075)
end

-- The id whose 8 bytes (a big-endian 64-bit integer, a V entry's) start at position i of
-- s, as 12 digits (id_str); nil when no item can have it (outside 1 .. 10^12 - 1, so its
-- top three bytes are 0 and the number is exact in a double).
local function id_at(s, i)
  local b1, b2, b3, b4, b5, b6, b7, b8 = string.byte(s, i, i + 7)
  if b1 + b2 + b3 > 0 then return nil end
  local n = b4 * 4294967296 + ((b5 * 256 + b6) * 256 + b7) * 256 + b8
  if n < 1 or n >= 1000000000000 then return nil end
  return id_str(n)
end

-- The 8 bytes of id (12 digits, 1 .. 10^12 - 1) as a V entry holds it (see id_at).
local function id_bytes(id)
  local n = tonumber(id)
  local high, low = math.floor(n / 4294967296), n % 4294967296
  return string.char(0, 0, 0, high, math.floor(low / 16777216), math.floor(low / 65536) % 256,
    math.floor(low / 256) % 256, low % 256)
end

-- The position (1-based, in values) of the largest of k big-endian doubles packed back
-- to back in `packed`, and whether every value is a finite number >= 0. Compared by their
-- bytes read as two 32-bit integers (not as strings: Lua compares strings by the server's
-- collation locale): for numbers >= 0 (sign bit 0) that order is the numbers', and a
-- negative number (-0.0 too), an infinity or a NaN has its high word at or above
-- 0x7FF00000, the high word of +inf. One pass, no number built per value.
local PLUS_INF_HIGH = 2146435072  -- 0x7FF00000
-- Whether the first byte of each `width`-byte field of `packed` is below `bound`: for
-- big-endian doubles and bound 127, each is finite, >= 0 (no sign bit) and below 2^1008.
local function all_first_bytes_below(packed, width, bound)
  local byte = string.byte
  for i = 1, #packed, width do
    if byte(packed, i) >= bound then return false end
  end
  return true
end
local function largest_double(packed, k)
  local byte = string.byte
  local top, high, low = 0, -1, -1
  for i = 1, k do
    local b1, b2, b3, b4, b5, b6, b7, b8 = byte(packed, 8 * i - 7, 8 * i)
    local h = ((b1 * 256 + b2) * 256 + b3) * 256 + b4
    if h >= high then
      local l = ((b5 * 256 + b6) * 256 + b7) * 256 + b8
      if h > high or l > low then top, high, low = i, h, l end
    end
  end
  return top, high < PLUS_INF_HIGH
end

-- The stamp of an entry (its third field).
local function entry_stamp(entry)
  local a = string.find(entry, '|', 3, true)
  local b = string.find(entry, '|', a + 1, true)
  return string.sub(entry, a + 1, (b or #entry + 1) - 1)
end

-- The reply a replica that is not current gets: {0, epoch, version, stamp, entries after
-- `have` (the replica's version, whose entry has stamp `have_stamp`)...}, at most
-- MASSLOG_REPLY_ROWS rows (at least one entry) of them: the replica asks again from where
-- they end. No entries when it cannot catch up from the log (another epoch, another
-- history at its version, or further behind than the list holds): it reads everything.
local function masslog_behind(K, epoch, have, have_stamp)
  local conf = redis.call('HMGET', K.meta, 'log_epoch', 'log_version', 'log_first', 'log_stamp')
  local out = {0, conf[1] or '', conf[2] or '0', conf[4] or ''}
  local version, first = tonumber(conf[2]) or 0, tonumber(conf[3]) or 0
  if conf[1] ~= epoch or have < first or have >= version then return out end
  local entries = redis.call('LRANGE', K.masslog, have - first,
    have - first + MASSLOG_REPLY_ENTRIES)
  if entry_stamp(entries[1]) ~= have_stamp then return out end
  local rows = 0
  for i = 2, #entries do
    local bar = string.find(entries[i], '|', 3, true)
    rows = rows + tonumber(string.sub(entries[i], 3, bar - 1))
    if rows > MASSLOG_REPLY_ROWS and i > 2 then break end
    out[#out + 1] = entries[i]
  end
  return out
end

-- Keep the entries after version `pin` until `ms` milliseconds from now for reader
-- `holder` (a replica reading the whole buffer needs them afterwards, however fast the
-- writers are), in place of that reader's earlier pin; other readers' pins stay as they
-- are. A holder of nil is named by the version (`tostring(pin)`).
local function masslog_pin(K, pin, ms, holder)
  if RB_NO_WRITES then return end
  local now, name = server_ms(), holder or tostring(pin)
  pins_keep(K, name, now, {name, pin, now + ms})
end

-- Drop reader `holder`'s pin (and any expired one); other readers' pins stay.
local function masslog_unpin(K, holder)
  if RB_NO_WRITES then return end
  pins_keep(K, holder, server_ms(), nil)
end

-- Items of log-reward +inf: the softmax is undefined while any is present.
local function infinite_count(prio_key)
  return redis.call('ZCOUNT', prio_key, '+inf', '+inf')
end
