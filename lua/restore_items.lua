-- Give staged restored items (see restore_stage.lua / restore.lua) their saved use counts,
-- after add.lua (or add_diverse.lua) stored them under the staging keys. Running it twice
-- writes the same values: it may be retried. (Their PER priorities go to the staged
-- snapshot, which the loading process writes itself: lua/restore.lua.)
-- @include common
-- @keys 13
-- @retry safe
-- KEYS[1] the staged meta  KEYS[2..] the other staged keys, in StagingKeys.all_keys() order
-- ARGV[1] first id of the staged items (as add.lua replied)
-- ARGV[k+1] for the k-th item (id first + k - 1): its use count (times sampled) as a
--   decimal integer
-- A use count of 0 is not written (absent means 0, as in lua/_items.lua). The call's sum is
-- kept in the staged meta under a field named by the first id (so that a retry writes the
-- same): uses:<first>; restore.lua adds these up, so that the swap never iterates the items.
-- Returns the number of items, n.
-- Errors: RB_NOBUF (the staged meta is gone), RB_INVALID (an id that is not staged, a count
-- that is not an integer in [0, 2^53]; nothing is written).
local K = buffer_keys(KEYS)
if redis.call('EXISTS', K.meta) == 0 then
  return fail('RB_NOBUF', 'staged meta ' .. K.meta .. ' does not exist')
end
local first, n = tonumber(ARGV[1]), #ARGV - 1
local ids, use_pairs, used = {}, {}, 0
for k = 1, n do ids[k] = id_str(first + k - 1) end
local staged = zmscore_chunked(K.order, ids)
for k = 1, n do
  if not staged[k] then
    return fail('RB_INVALID', 'item ' .. ids[k] .. ' is not staged in ' .. K.order)
  end
  local uses = ARGV[k + 1]
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
call_chunked('HSET', K.uses, use_pairs)
redis.call('HSET', K.meta, 'uses:' .. ARGV[1], string.format('%.0f', used))
return n
