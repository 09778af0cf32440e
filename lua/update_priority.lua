-- Set PER priorities of stored items, atomically for the whole call.
-- @include common
-- @include masslog
-- @include items
-- @keys 13
-- @retry never
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order
-- ARGV[1..] id_1, priority_1, ..., id_n, priority_n  (ids 12-digit, priorities as text);
-- or, packed (an odd count): ARGV[1] the ids (see unpack_ids)  ARGV[2] their width
-- ARGV[3] the priorities as text, comma-separated
-- or, from a process whose replica of the priorities is current (ARGV[1] "@"): ARGV[2..4]
-- the replica's log_epoch, log_version and log_stamp  ARGV[5] the ids (distinct, 12 digits
-- each, back to back), the h it holds first  ARGV[6] their priorities (plain decimal
-- text, comma-separated)  ARGV[7] the h ids' priorities before, as the replica holds them
-- (16 hex digits of IEEE 754 bits each, big-endian)  ARGV[8] the sum of those before
-- ARGV[9] how many of those before are non-zero. When the log is still at that version,
-- the script reads no item (the replica says which are present and what they held): it
-- writes the h priorities and one P entry (lua/_masslog.lua). Otherwise it treats every
-- id and priority as the packed form does.
-- Ids no longer stored (evicted, removed) are skipped; for a repeated id the last priority
-- wins. O(1) server work per id: one HMGET (none from a current replica) and one HSET of
-- the per hash and one mass-log entry for the whole call (samplers' replicas re-weigh the
-- items).
-- Returns {updated, log_epoch, log_version before, log_version after, log_stamp before,
-- log_stamp after}: the number of distinct ids updated, and what a replica at the version
-- before needs to apply this change itself (the versions differ by one when this call's
-- entry is the only change).
-- Errors: RB_NOBUF, RB_CONFIG (PER is not on), RB_BUSY (PER is being turned on: finish
-- it with lua/enable_per.lua and call again), RB_INVALID (a priority that is NaN,
-- negative or not finite; nothing is written), RB_LIMIT (more than RB_MAX_ITEMS ids).
local K = buffer_keys(KEYS)
local conf = redis.call('HMGET', K.meta, 'capacity', 'mass', 'log_epoch', 'log_version',
  'per_fill', 'log_stamp')
if not conf[1] then return fail('RB_NOBUF', 'buffer meta ' .. K.meta .. ' does not exist') end
if conf[2] ~= 'per' then
  return fail('RB_CONFIG', 'buffer ' .. K.meta .. ' has no PER priorities (use PERSampler)')
end
if conf[5] then
  return fail('RB_BUSY', 'PER is being turned on for ' .. K.meta .. ' (lua/enable_per.lua)')
end
-- What a replica at the version before needs to apply this change itself (see Returns).
local function reply(updated)
  local after = redis.call('HMGET', K.meta, 'log_epoch', 'log_version', 'log_stamp')
  return {updated, after[1] or '', conf[4] or '0', after[2] or '0', conf[6] or '',
    after[3] or ''}
end

-- The "@" form while the log is at the sender's version: the h held ids' priorities
-- written without reading an item; nil (nothing written) when not current, not in that
-- form's shape, or a priority is to be refused or respelled (the packed path says so).
local function from_current_replica(ids)
  local held = #ARGV[7] / 16
  if not (ARGV[2] == conf[3] and ARGV[3] == conf[4] and ARGV[4] == conf[6]
      and #ids <= RB_MAX_ITEMS and #ARGV[5] == 12 * #ids and held <= #ids
      and held == math.floor(held) and plain_decimals(ARGV[6])) then
    return nil
  end
  -- the packed path's check of each priority, written inline: Lua's per-id work is most
  -- of this script's time
  local pairs_, values, top, stop, huge = {}, {}, 0, 1, math.huge
  for text, after in string.gmatch(ARGV[6], '([^,]+)()') do
    if #values == held then break end
    local value = tonumber(text)
    if value == nil or value ~= value or value < 0 or value == huge then return nil end
    local k = #values + 1
    values[k] = value
    pairs_[2 * k - 1] = ids[k]
    pairs_[2 * k] = text
    if value > top then top = value end
    stop = after
  end
  if #values ~= held then return nil end
  if held > 0 then
    call_chunked('HSET', K.per, pairs_)
    per_heap_set(K, pairs_)
    per_account(K, nil, values, {tonumber(ARGV[8]), tonumber(ARGV[9])})
    per_raise_max(K, top)
    if masslog_on(K) then
      masslog_push(K, 'P', held, string.sub(ARGV[5], 1, 12 * held) .. '|'
        .. string.sub(ARGV[6], 1, stop - 1) .. '|' .. ARGV[7])
    end
  end
  return reply(held)
end

local ids, texts, listed = {}, {}, nil
if ARGV[1] == '@' then
  ids = unpack_ids(ARGV[5], 12)
  local done = from_current_replica(ids)
  if done then return done end
  listed = ARGV[6]  -- not current: every id is read as in the packed form
elseif #ARGV % 2 == 1 then
  ids = unpack_ids(ARGV[1], tonumber(ARGV[2]))
  listed = ARGV[3]
else
  for i = 1, #ARGV / 2 do
    ids[i] = ARGV[2 * i - 1]
    texts[i] = ARGV[2 * i]
  end
end
if listed then
  for text in string.gmatch(listed, '[^,]+') do texts[#texts + 1] = text end
  if #texts ~= #ids then
    return fail('RB_INVALID', #texts .. ' priorities for ' .. #ids .. ' ids')
  end
end
if #ids > RB_MAX_ITEMS then
  return fail('RB_LIMIT', 'one command updates at most ' .. RB_MAX_ITEMS .. ' priorities, got '
    .. #ids .. ' (redisbuf/store/bounds.py)')
end
-- one loop over the ids (Lua's per-id work is most of this script's time)
local values, last, repeated, huge = {}, {}, false, math.huge
for i = 1, #ids do
  local value = tonumber(texts[i])
  if value == nil or value ~= value or value < 0 or value == huge then
    return fail('RB_INVALID', 'priority ' .. (i - 1) .. ' is ' .. tostring(texts[i])
      .. '; priorities must be finite and >= 0')
  end
  values[i] = value
  local id = ids[i]
  if last[id] then repeated = true end
  last[id] = i
end
-- a plain decimal as sent is stored as it is (numpy and Lua read it alike); any other
-- spelling of the number (hex, spaces) is written anew
if not plain_decimals(table.concat(texts, ',')) then
  for i = 1, #texts do
    if not plain_decimals(texts[i]) then texts[i] = fmt(values[i]) end
  end
end
return reply(set_priorities(K, ids, values, texts, repeated and last))
