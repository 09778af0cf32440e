-- Stage one slice of a large add (an add above one add's bound, redisbuf/buffers/staged.py):
-- each slice is one MULTI/EXEC of a native HSET of its blobs into KEYS[2] (fields: the
-- items' positions in the batch, from 0) and this script, which checks and stores the
-- slice's texts; lua/add_staged.lua then commits the whole. No reader looks at these keys,
-- and they expire ARGV[2] ms after the last slice unless the commit takes them, so a
-- writer that dies before its commit leaves nothing.
-- @include common
-- @include insert
-- @keys 3
-- @retry safe
-- KEYS[1] meta  KEYS[2] the staged blobs (rb:{NAME}:adding:BATCH:blobs)
-- KEYS[3] the staged texts (rb:{NAME}:adding:BATCH:texts)
-- ARGV[1] schema (canonical JSON)  ARGV[2] expiry in ms  ARGV[3] start (the slice's first
-- position)  ARGV[4] count  ARGV[5] "1" when PER priorities follow, else "0"
-- ARGV[6..5+count] log-rewards (text)  then, with ARGV[5] "1", count PER priorities (text)
-- Writes the texts fields "<position>" (log-reward), "p<position>" (PER priority) and
-- "s<start>" = start + count, where the slice ends (the apply stores a slice a step).
-- Returns count. Errors (nothing written): RB_INVALID (a log-reward that is NaN, or not 0
-- for a schema without log_rewards; a PER priority not finite and >= 0; a bad count),
-- RB_LIMIT (more than RB_MAX_ADD items).
local start, count = tonumber(ARGV[3]), tonumber(ARGV[4])
if start == nil or count == nil or count < 1 or start < 0 then
  return fail('RB_INVALID', 'ARGV[3] and ARGV[4] must be the slice start and count')
end
if count > RB_MAX_ADD then
  return fail('RB_LIMIT', 'one slice stages at most ' .. RB_MAX_ADD .. ' items, got ' .. count)
end
local per = ARGV[5] == '1'
if #ARGV ~= 5 + count * (per and 2 or 1) then
  return fail('RB_INVALID', 'expected ' .. count .. ' log-rewards'
    .. (per and ' and as many PER priorities' or ''))
end
local rewards = {}
for i = 1, count do rewards[i] = ARGV[5 + i] end
local err = check_priorities(rewards) or check_schema({}, ARGV[1], rewards)
if err then return err end
local pairs_ = {'s' .. start, start + count}
for i = 1, count do
  pairs_[#pairs_ + 1] = tostring(start + i - 1)
  pairs_[#pairs_ + 1] = rewards[i]
end
if per then
  for i = 1, count do
    local text = ARGV[5 + count + i]
    if per_parse(text) == nil then
      return fail('RB_INVALID', 'item ' .. (start + i - 1) .. ' has PER priority '
        .. tostring(text) .. '; priorities must be finite and >= 0')
    end
    pairs_[#pairs_ + 1] = 'p' .. (start + i - 1)
    pairs_[#pairs_ + 1] = text
  end
end
call_chunked('HSET', KEYS[3], pairs_)
redis.call('PEXPIRE', KEYS[2], ARGV[2])
redis.call('PEXPIRE', KEYS[3], ARGV[2])
return count
