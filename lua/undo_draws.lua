-- Take back draws a sampler discarded (an item was evicted between the draw and the read
-- of its blob), without recreating a dropped buffer's meta.
-- @include common
-- @include masslog
-- @include items
-- @keys 13
-- @retry never
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order (see
-- buffer_keys in _common.lua)
-- ARGV[1..] the discarded draws' item ids (may repeat)
-- Returns 0.
local ids = {}
for i = 1, #ARGV do ids[i] = ARGV[i] end
unrecord_draws(buffer_keys(KEYS), ids)
return 0
