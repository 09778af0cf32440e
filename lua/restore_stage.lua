-- Start a restore: create the staged meta (see restore.lua) with the buffer's
-- configuration, and reserve ids for the restored items.
-- @include common
-- @include removers
-- @keys 2
-- @retry never
-- KEYS[1] the buffer's meta  KEYS[2] the staged meta (StagingKeys.meta)
-- ARGV[1] n, the number of items to restore
-- The buffer's last_id grows by n now, so ids handed to concurrent adds are never given
-- to a restored item; the staged meta's last_id is set just below the reserved block.
-- When the buffer uses PER, the staged meta's per_default is its new-item priority
-- (per_initial, else 1): restore_items.lua gives it to the items saved without one; when
-- its remover reads PER priorities (lua/_removers.lua) the staged meta keeps a heap
-- (per_heap = 1), which the loading process fills and restore.lua swaps in with the rest.
-- Returns the first reserved id. Errors: RB_NOBUF.
local conf = redis.call('HMGET', KEYS[1], 'capacity', 'eviction', 'format_version', 'created_at',
  'mass', 'per_initial')
if not conf[1] then return fail('RB_NOBUF', 'buffer meta ' .. KEYS[1] .. ' does not exist') end
local n = tonumber(ARGV[1])
local last = redis.call('HINCRBY', KEYS[1], 'last_id', n)
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], 'capacity', conf[1], 'eviction', conf[2],
  'format_version', conf[3] or '1', 'created_at', conf[4] or '0', 'last_id', last - n,
  'inserted', 0, 'evicted', 0, 'sampled', 0, 'masslog', 0)
if conf[5] == 'per' then redis.call('HSET', KEYS[2], 'per_default', conf[6] or '1') end
if conf[5] == 'per' and needs_per(conf[2] or '') then
  redis.call('HSET', KEYS[2], 'per_heap', '1')
end
return last - n + 1
