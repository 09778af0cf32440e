-- Replace the records of stored items (DI-engine's update of an item's data and meta):
-- each item keeps its id, place in the insertion order, log-reward, PER priority, uses
-- and version; only its record changes. Ids not stored are skipped. With expected
-- records, an item whose record is no longer the one given (another process replaced
-- it meanwhile) is left as it is: the caller reads it again and retries.
-- @include common
-- @keys 13
-- @retry never
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order (see
-- buffer_keys in _common.lua)
-- ARGV[1] the records' schema (canonical JSON; must be the stored one)  ARGV[2] "" (no
-- check) or "expect"  ARGV[3..] per item: id (stored form, 12 digits), new record, and with
-- "expect" the record it must still hold
-- At most RB_MAX_ADD items and, with more than one, RB_MAX_ADD_BYTES of new records per
-- call. Returns one number per item: 1 replaced, 0 not stored, -1 holds another record
-- than expected. Errors: RB_NOBUF, RB_SCHEMA (another schema: the message holds the
-- stored one), RB_INVALID (arguments that do not come in whole items), RB_LIMIT.
local K = buffer_keys(KEYS)
local step = ARGV[2] == 'expect' and 3 or 2
local count = (#ARGV - 2) / step
if #ARGV < 2 or count ~= math.floor(count) then
  return fail('RB_INVALID', 'expected schema, mode and whole items of ' .. step
    .. ' arguments, got ' .. #ARGV .. ' arguments')
end
if count > RB_MAX_ADD then
  return fail('RB_LIMIT', 'one call replaces at most ' .. RB_MAX_ADD .. ' records, got ' .. count)
end
local conf = redis.call('HMGET', K.meta, 'capacity', 'schema')
if not conf[1] then
  return fail('RB_NOBUF', 'buffer meta ' .. K.meta .. ' does not exist')
end
if conf[2] ~= ARGV[1] then return fail('RB_SCHEMA', tostring(conf[2])) end
local size = 0
for i = 3, #ARGV, step do size = size + #ARGV[i + 1] end
if count > 1 and size > RB_MAX_ADD_BYTES then
  return fail('RB_LIMIT', 'one call replaces at most ' .. RB_MAX_ADD_BYTES
    .. ' bytes of records, got ' .. size)
end
local out = {}
for i = 3, #ARGV, step do
  local held = redis.call('HGET', K.items, ARGV[i])
  if not held then
    out[#out + 1] = 0
  elseif step == 3 and held ~= ARGV[i + 2] then
    out[#out + 1] = -1
  else
    redis.call('HSET', K.items, ARGV[i], ARGV[i + 1])
    out[#out + 1] = 1
  end
end
return out
