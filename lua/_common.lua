-- Shared helpers, a helper scripts name with "-- @include common" (redisbuf/store/scripts.py
-- pastes every helper a script needs once, after the helpers it includes).
-- Not an operation of its own.
-- (the standard library read when called: the functions library makes its helpers when it
-- loads, where neither `table` nor `unpack` is there yet)
local unpack = function(...) return (table.unpack or unpack)(...) end
local CHUNK = 1000  -- both real Redis and fakeredis refuse unpack() of ~8000 values

-- A PER priority counts in meta per_sum as at most this (2^990, about 1e298, as
-- PER_SUM_CAP in redisbuf/buffers/priorities.py): 2^32 items sum to a finite number, and
-- sums of capped ones are exact (a power of two).
local PER_SUM_CAP = 2 ^ 990

local function fmt(x)
  return string.format('%.17g', x)
end

local function id_str(n)
  return string.format('%012d', n)
end

-- Lua 5.3+ (fakeredis) refuses tonumber('-inf'); Redis' Lua 5.1 accepts it.
local function to_number(s)
  if s == '-inf' then return -math.huge end
  if s == 'inf' or s == '+inf' then return math.huge end
  return tonumber(s)
end

-- Whether the text of finite numbers (one, or several joined) spells each as plain decimal,
-- as numpy reads it too: tonumber also reads hex (0x...) and surrounding white space.
-- Plain searches: a character class is matched a character at a time (~40 ns each).
local NOT_PLAIN = {'x', 'X', ' ', '\t', '\n', '\r', '\v', '\f'}
local function plain_decimals(text)
  for i = 1, #NOT_PLAIN do
    if string.find(text, NOT_PLAIN[i], 1, true) then return false end
  end
  return true
end

-- Ids sent packed: `width` decimal digits each, back to back (one argument instead of one
-- per id). Width 12 is the stored form itself (id_str); a wider one (ids from 10^12 on)
-- is read as a number and written back in the stored form. With `every` (default 1),
-- only the first of each `every` ids: the rest are never cut out.
local function unpack_ids(packed, width, every)
  local ids, step = {}, width * (every or 1)
  for i = 1, #packed / step do
    local at = step * (i - 1)
    ids[i] = string.sub(packed, at + 1, at + width)
  end
  if width ~= 12 then
    for i = 1, #ids do ids[i] = id_str(tonumber(ids[i])) end
  end
  return ids
end

local function call_chunked(cmd, key, list, step)
  step = step or CHUNK
  for i = 1, #list, step do
    redis.call(cmd, key, unpack(list, i, math.min(i + step - 1, #list)))
  end
end

-- The replies of a multi-member read (HMGET, ZMSCORE) of every member, in order, CHUNK
-- members a call (Lua's unpack has a stack limit).
local function read_chunked(cmd, key, members)
  local out = {}
  for i = 1, #members, CHUNK do
    local part = redis.call(cmd, key, unpack(members, i, math.min(i + CHUNK - 1, #members)))
    for j = 1, #part do out[#out + 1] = part[j] end
  end
  return out
end

local function hmget_chunked(key, fields)
  return read_chunked('HMGET', key, fields)
end

local function zmscore_chunked(key, members)
  return read_chunked('ZMSCORE', key, members)
end

-- Whether the prio zset holds the items' log-rewards. A buffer whose schema has no
-- log_rewards field (meta rewards = 0, set with the schema) keeps no prio zset: every
-- item's log-reward is 0, so reward order is insertion order (the order zset) and a
-- reward read answers 0 for an item present.
local function rewards_kept(K)
  return redis.call('HGET', K.meta, 'rewards') ~= '0'
end

-- The meta rewards flag for a schema (JSON): 0 when it lists fields and log_rewards is
-- not one of them, else 1.
local function schema_rewards(schema_json)
  local ok, schema = pcall(cjson.decode, schema_json)
  if ok and type(schema) == 'table' and type(schema['fields']) == 'table'
      and schema['fields']['log_rewards'] == nil then
    return '0'
  end
  return '1'
end

local function fail(code, message)
  return redis.error_reply(code .. ' ' .. message)
end

-- The i-th uniform in [0, 1) of a string of 6-byte little-endian integers (48 random
-- bits each): cheaper to send and parse than decimal text.
local function uniform_at(packed, i)
  local b1, b2, b3, b4, b5, b6 = string.byte(packed, 6 * i - 5, 6 * i)
  return (((((b6 * 256 + b5) * 256 + b4) * 256 + b3) * 256 + b2) * 256 + b1) / 281474976710656
end

-- Raise RB_APPLYING while a large add is being applied to the buffer of meta key `meta`
-- (meta field "applying", lua/_apply.lua): the caller runs lua/add_apply.lua (FCALL
-- rb_add_apply) until the add is stored whole, then calls again, so that no script sees
-- part of it. Called before any other read or write.
local function refuse_while_applying(meta)
  if redis.call('HEXISTS', meta, 'applying') == 1 then
    error('RB_APPLYING ' .. meta .. ' is storing a large add a slice at a time: run '
      .. 'add_apply (FCALL rb_add_apply) until it is done, then call again')
  end
end

-- The buffer's keys, for scripts whose KEYS are BufferKeys.all_keys() in that order (every
-- script that adds, removes or draws items takes them all, so any part may touch any key).
-- Refuses while a large add is being applied (refuse_while_applying) unless `applying_ok`
-- (the scripts that apply it).
local function buffer_keys(keys, applying_ok)
  if not applying_ok then refuse_while_applying(keys[1]) end
  return {
    meta = keys[1], items = keys[2], prio = keys[3], order = keys[4], per_heap = keys[5],
    per = keys[6], uses = keys[7], versions = keys[8], times = keys[9], vecs = keys[10],
    batches = keys[11], batches_old = keys[12], masslog = keys[13],
  }
end

-- Wake processes waiting on this buffer (redisbuf/sampling/waiting.py): publish on its change
-- channel, the meta key with ':meta' replaced by ':changed'. Costs nothing unsubscribed.
local function notify_changed(meta_key)
  redis.call('PUBLISH', string.sub(meta_key, 1, #meta_key - 4) .. 'changed', '1')
end
