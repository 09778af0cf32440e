-- Give staged restored items (see restore_stage.lua / restore.lua) their saved PER
-- priorities and use counts, after add.lua (or add_diverse.lua) stored them under the
-- staging keys. Running it twice writes the same values: it may be retried.
-- @include common
-- KEYS[1] the staged meta  KEYS[2..] the other staged keys, in StagingKeys.all_keys() order
-- ARGV[1] first id of the staged items (as add.lua replied)
-- ARGV[2k], ARGV[2k+1] for the k-th item (id first + k - 1): its PER priority as text, or
--   "" for none; its use count (times sampled) as a decimal integer
-- A use count of 0 is not written (absent means 0, as in lua/_items.lua).
-- Returns the number of items, n.
-- Errors: RB_NOBUF (the staged meta is gone), RB_INVALID (an id that is not staged, a
-- priority that is not a finite number >= 0, a count that is not an integer in
-- [0, 2^53]; nothing is written).
local K = buffer_keys(KEYS)
if redis.call('EXISTS', K.meta) == 0 then
  return fail('RB_NOBUF', 'staged meta ' .. K.meta .. ' does not exist')
end
local first, n = tonumber(ARGV[1]), (#ARGV - 1) / 2
local ids, per_pairs, use_pairs = {}, {}, {}
for k = 1, n do ids[k] = id_str(first + k - 1) end
local staged = zmscore_chunked(K.order, ids)
for k = 1, n do
  if not staged[k] then
    return fail('RB_INVALID', 'item ' .. ids[k] .. ' is not staged in ' .. K.order)
  end
  local text, uses = ARGV[2 * k], ARGV[2 * k + 1]
  if text ~= '' then
    local value = tonumber(text)
    if value == nil or value ~= value or value < 0 or value == math.huge then
      return fail('RB_INVALID', 'item ' .. ids[k] .. ' has PER priority ' .. text
        .. '; priorities must be finite and >= 0')
    end
    per_pairs[#per_pairs + 1] = ids[k]
    per_pairs[#per_pairs + 1] = fmt(value)
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
  end
end
call_chunked('HSET', K.per, per_pairs)
call_chunked('HSET', K.uses, use_pairs)
return n
