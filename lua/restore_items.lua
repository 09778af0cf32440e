-- Give staged restored items (see restore_stage.lua / restore.lua) their saved PER
-- priorities and use counts, after add.lua (or add_diverse.lua) stored them under the
-- staging keys. Running it twice writes the same values: it may be retried.
-- @include common
-- @keys 13
-- @retry safe
-- KEYS[1] the staged meta  KEYS[2..] the other staged keys, in StagingKeys.all_keys() order
-- ARGV[1] first id of the staged items (as add.lua replied)
-- ARGV[2k], ARGV[2k+1] for the k-th item (id first + k - 1): its PER priority as text, or
--   "" for none; its use count (times sampled) as a decimal integer
-- A use count of 0 is not written (absent means 0, as in lua/_items.lua).
-- When the staged meta has per_default (restore_stage.lua: the buffer uses PER), an item
-- without a priority gets that one. The call's sums are kept in the staged meta under
-- fields named by the first id (so that a retry writes the same): uses:<first> (the use
-- counts' sum) and, with PER, per:<first> = "count,sum,nonzero,max" of the priorities
-- given; restore.lua adds these up, so that the swap never iterates the items.
-- Returns the number of items, n.
-- Errors: RB_NOBUF (the staged meta is gone), RB_INVALID (an id that is not staged, a
-- priority that is not a finite number >= 0, a count that is not an integer in
-- [0, 2^53]; nothing is written).
local K = buffer_keys(KEYS)
if redis.call('EXISTS', K.meta) == 0 then
  return fail('RB_NOBUF', 'staged meta ' .. K.meta .. ' does not exist')
end
local first, n = tonumber(ARGV[1]), (#ARGV - 1) / 2
local ids, per_pairs, use_pairs, unset = {}, {}, {}, {}
local used, count, sum, comp, nonzero, top = 0, 0, 0, 0, 0, 0
local function account(id, value)
  per_pairs[#per_pairs + 1] = id
  per_pairs[#per_pairs + 1] = fmt(value)
  count = count + 1
  if value > 0 then
    nonzero = nonzero + 1
    local x = math.min(value, PER_SUM_CAP)  -- compensated, as per_account in lua/_items.lua
    local t = sum + x
    if math.abs(sum) >= x then comp = comp + ((sum - t) + x)
    else comp = comp + ((x - t) + sum) end
    sum = t
  end
  if value > top then top = value end
end
for k = 1, n do ids[k] = id_str(first + k - 1) end
local staged = zmscore_chunked(K.order, ids)
for k = 1, n do
  if not staged[k] then
    return fail('RB_INVALID', 'item ' .. ids[k] .. ' is not staged in ' .. K.order)
  end
  local text, uses = ARGV[2 * k], ARGV[2 * k + 1]
  if text == '' then unset[#unset + 1] = ids[k] end
  if text ~= '' then
    local value = tonumber(text)
    if value == nil or value ~= value or value < 0 or value == math.huge then
      return fail('RB_INVALID', 'item ' .. ids[k] .. ' has PER priority ' .. text
        .. '; priorities must be finite and >= 0')
    end
    account(ids[k], value)
  end
  -- compared as text: 2^53 + 1 would round to 2^53 as a number
  if not string.match(uses, '^%d+$') or #uses > 16
      or (#uses == 16 and uses > '9007199254740992') then
    return fail('RB_INVALID', 'item ' .. ids[k] .. ' has use count ' .. uses
      .. '; use counts must be integers in [0, 2^53]')
  end
  if tonumber(uses) > 0 then
    use_pairs[#use_pairs + 1] = ids[k]
    use_pairs[#use_pairs + 1] = uses
    used = used + tonumber(uses)
  end
end
-- read once every check passed (a refused call leaves the meta as it found it)
local default = #unset > 0 and redis.call('HGET', K.meta, 'per_default')
if default then
  for _, id in ipairs(unset) do account(id, tonumber(default)) end
end
call_chunked('HSET', K.per, per_pairs)
call_chunked('HSET', K.uses, use_pairs)
redis.call('HSET', K.meta, 'uses:' .. ARGV[1], string.format('%.0f', used))
if count > 0 then
  redis.call('HSET', K.meta, 'per:' .. ARGV[1],
    count .. ',' .. fmt(sum + comp) .. ',' .. nonzero .. ',' .. fmt(top))
end
return n
