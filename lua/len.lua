-- The number of items a buffer holds (what len(ReplayBuffer) reads): one ZCARD.
-- @keys 2
-- @retry safe
-- KEYS[1] meta  KEYS[2] order
-- Returns the length (0 for a buffer that does not exist). Reads only (no-writes).
-- Errors: RB_APPLYING (a large add is being stored: refuse_while_applying in _common.lua).
-- @include common
refuse_while_applying(KEYS[1])
return redis.call('ZCARD', KEYS[2])
