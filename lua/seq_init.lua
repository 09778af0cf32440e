-- Create a SequenceBuffer's meta hash, or check that the stored configuration matches.
-- @include common
-- KEYS[1] meta (SequenceKeys.meta)
-- ARGV[1] configuration as canonical JSON
-- ARGV[2..] field, value pairs stored in meta on creation (numbers the scripts read)
-- Returns 1 when created, 0 when the buffer existed with the same configuration.
-- Errors: RB_CONFIG (the buffer exists with another configuration).
local stored = redis.call('HGET', KEYS[1], 'config')
if stored then
  if stored ~= ARGV[1] then
    return redis.error_reply('RB_CONFIG stored configuration ' .. stored
      .. ' differs from the requested ' .. ARGV[1])
  end
  return 0
end
local pairs_ = {'config', ARGV[1], 'size', 0, 'added', 0, 'evicted', 0,
  'sampled', 0, 'nonzero', 0}
for i = 2, #ARGV do pairs_[#pairs_ + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(pairs_))
return 1
