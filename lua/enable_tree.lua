-- Build (or rebuild) the sum tree that prioritized sampling walks; add.lua keeps it
-- up to date from then on, whichever process adds.
-- @include common
-- @include tree
-- KEYS[1] meta  KEYS[2] prio  KEYS[3] tree  KEYS[4] tree:ids  KEYS[5] tree:slots
-- KEYS[6] tree:free
-- ARGV[1] "1" = rebuild even if the tree exists
-- Returns 1 if built (or rebuilt from an earlier layout), 0 if it already existed.
-- Errors: RB_NOBUF, RB_CONFIG (the buffer uses PER).
local meta = KEYS[1]
local conf = redis.call('HMGET', meta, 'tree', 'capacity')
if not conf[2] then return fail('RB_NOBUF', 'buffer meta ' .. meta .. ' does not exist') end
if redis.call('HGET', meta, 'tree_mass') == 'per' then
  return fail('RB_CONFIG', 'buffer ' .. meta .. ' uses prioritized experience replay (PERSampler):'
    .. ' its sum tree holds PER priorities, not log-rewards')
end
local current = redis.call('HGET', meta, 'tree_layout') == TREE_LAYOUT  -- else rebuild it
if conf[1] == '1' and ARGV[1] ~= '1' and current then return 0 end
tree_rebuild(meta, KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], tonumber(conf[2]))
return 1
