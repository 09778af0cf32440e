-- Template of the functions library (redisbuf/store/functions.py), nothing to fill:
-- rb_add's callback. It checks what a non-Python caller may get wrong before add.lua's
-- first write (add.lua trusts its ARGV: ReplayBuffer builds it), then runs add.lua
-- (OP.add), or with a batch id its remembering variant (ONCE.add, lua/_remember.lua),
-- which takes the two batch-memory keys and the id and window off the ends of KEYS and
-- ARGV. Uses the library's DEFAULT_WINDOW and RB_MAX_ADD (lua/_library.lua).
-- KEYS: the 13 buffer keys  ARGV: as rb_add (docs/wire-format.md)
local function rb_add_checked(keys, args)
  if #keys ~= 13 then
    return redis.error_reply('RB_INVALID rb_add takes the 13 buffer keys, got ' .. #keys)
  end
  local n = tonumber(args[2])
  if n == nil or n < 1 or n ~= math.floor(n) then
    return redis.error_reply('RB_INVALID ARGV[2] must be the number of items (>= 1), got '
      .. tostring(args[2]))
  end
  if n > RB_MAX_ADD then
    return redis.error_reply('RB_LIMIT one add stores at most ' .. RB_MAX_ADD
      .. ' items, got ' .. n .. ' (send several batches)')
  end
  local extra = #args - (3 + 2 * n)
  if extra ~= 0 and extra ~= 1 then
    return redis.error_reply('RB_INVALID expected ' .. (3 + 2 * n) .. ' or ' .. (4 + 2 * n)
      .. ' arguments (schema, n, options, n blob / log-reward pairs, [batch id]), got ' .. #args)
  end
  local ok, schema = pcall(cjson.decode, args[1])
  if not ok or type(schema) ~= 'table' or type(schema['kind']) ~= 'string'
      or type(schema['fields']) ~= 'table' then
    return redis.error_reply('RB_SCHEMA ARGV[1] must be a schema: canonical JSON with kind '
      .. 'and fields')
  end
  if args[3] ~= '' then
    local okopt, options = pcall(cjson.decode, args[3])
    if not okopt or type(options) ~= 'table' then
      return redis.error_reply('RB_INVALID ARGV[3] must be "" or a JSON object')
    end
  end
  if extra == 0 then return OP.add(keys, args, false) end
  local window = tonumber(redis.call('HGET', keys[1], 'retry_window')) or DEFAULT_WINDOW
  local rkeys, rargs = {}, {}
  for i = 1, #keys do rkeys[i] = keys[i] end
  rkeys[#rkeys + 1] = keys[11]  -- batches
  rkeys[#rkeys + 1] = keys[12]  -- batches:old
  for i = 1, #args do rargs[i] = args[i] end
  rargs[#rargs + 1] = tostring(math.floor(window * 1000))
  return ONCE.add(rkeys, rargs)
end
