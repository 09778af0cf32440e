-- Replace the records of stored items (DI-engine's update of an item's data and meta):
-- each item keeps its id, place in the insertion order, log-reward, PER priority, uses
-- and version; only its record changes. Ids not stored are skipped. With expected
-- records, an item whose record is no longer the one given (another process replaced
-- it meanwhile) is left as it is: the caller reads it again and retries. With
-- priorities, each replaced item's PER priority is set too (the running max, one
-- mass-log entry naming the items, stored: set_priorities in lua/_items.lua), in the same
-- atomic step.
-- @include common
-- @include masslog
-- @include items
-- @keys 13
-- @retry never
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order (see
-- buffer_keys in _common.lua)
-- ARGV[1] the records' schema (canonical JSON; must be the stored one)  ARGV[2] flags:
-- "e" (expected records given) and / or "p" (priorities given), or ""  ARGV[3..] per
-- item: id (stored form, 12 digits), new record, with "e" the record it must still hold,
-- with "p" its PER priority (plain decimal text)
-- At most RB_MAX_ADD items and, with more than one, RB_MAX_ADD_BYTES of new records per
-- call. Returns one number per item: 1 replaced, 0 not stored, -1 holds another record
-- than expected. Errors: RB_NOBUF, RB_SCHEMA (another schema: the message holds the
-- stored one), RB_INVALID (arguments that do not come in whole items, a priority that is
-- not finite and >= 0), RB_CONFIG (priorities without PER), RB_BUSY (PER is being turned
-- on), RB_LIMIT; an error writes nothing.
local K = buffer_keys(KEYS)
local flags = ARGV[2] or ''
local expect = string.find(flags, 'e', 1, true) ~= nil
local with_priority = string.find(flags, 'p', 1, true) ~= nil
local step = 2 + (expect and 1 or 0) + (with_priority and 1 or 0)
local count = (#ARGV - 2) / step
if #ARGV < 2 or count ~= math.floor(count) then
  return fail('RB_INVALID', 'expected schema, mode and whole items of ' .. step
    .. ' arguments, got ' .. #ARGV .. ' arguments')
end
if count > RB_MAX_ADD then
  return fail('RB_LIMIT', 'one call replaces at most ' .. RB_MAX_ADD .. ' records, got ' .. count)
end
local conf = redis.call('HMGET', K.meta, 'capacity', 'schema', 'mass', 'per_fill')
if not conf[1] then
  return fail('RB_NOBUF', 'buffer meta ' .. K.meta .. ' does not exist')
end
if conf[2] ~= ARGV[1] then return fail('RB_SCHEMA', tostring(conf[2])) end
if with_priority then
  if conf[3] ~= 'per' then
    return fail('RB_CONFIG', 'buffer ' .. K.meta .. ' has no PER priorities (use PERSampler)')
  end
  if conf[4] then
    return fail('RB_BUSY', 'PER is being turned on for ' .. K.meta .. ' (lua/enable_per.lua)')
  end
  for i = 3, #ARGV, step do
    local text = ARGV[i + step - 1]
    if per_parse(text) == nil or not plain_decimals(text) then
      return fail('RB_INVALID', 'priority ' .. tostring(text) .. ' of item ' .. ARGV[i]
        .. ' must be a finite number >= 0 in plain decimals')
    end
  end
end
local size = 0
for i = 3, #ARGV, step do size = size + #ARGV[i + 1] end
if count > 1 and size > RB_MAX_ADD_BYTES then
  return fail('RB_LIMIT', 'one call replaces at most ' .. RB_MAX_ADD_BYTES
    .. ' bytes of records, got ' .. size)
end
local out, ids, values, texts, last, repeated = {}, {}, {}, {}, {}, false
for i = 3, #ARGV, step do
  local held = redis.call('HGET', K.items, ARGV[i])
  if not held then
    out[#out + 1] = 0
  elseif expect and held ~= ARGV[i + 2] then
    out[#out + 1] = -1
  else
    redis.call('HSET', K.items, ARGV[i], ARGV[i + 1])
    out[#out + 1] = 1
    if with_priority then
      local id, text = ARGV[i], ARGV[i + step - 1]
      ids[#ids + 1] = id
      values[#ids] = tonumber(text)
      texts[#ids] = text
      if last[id] then repeated = true end
      last[id] = #ids
    end
  end
end
if #ids > 0 then set_priorities(K, ids, values, texts, repeated and last) end
return out
