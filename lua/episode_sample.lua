-- Draw whole episodes uniformly and return their steps.
-- @include common
-- @include episodes
-- @keys 4
-- @retry never
-- KEYS[1] meta  KEYS[2] index  KEYS[3] lens  KEYS[4] steps
-- ARGV[1] n  ARGV[2] "1" = with replacement, "0" = without
-- ARGV[3] n uniforms in [0, 1), packed 6 bytes each (see uniform_at)
-- Without replacement every n-subset of the stored episodes is equally likely (sparse
-- Fisher-Yates over insertion ranks); with replacement each draw is independent.
-- ARGV[4] "1" = also return the blobs (atomic), "0" = only where the episodes are (a step
-- position is never reused and an episode's steps go in one script, so a later HMGET of
-- an episode's positions finds all its steps or none)
-- ARGV[5] (optional, default 0) draws of the caller's previous attempt that it threw away
-- (an episode evicted before its HMGET): taken off meta `sampled`, which counts episodes
-- returned
-- Returns {schema text, entry_1..entry_n}, one entry per draw: {episode id, position of
-- its first step, number of steps, blob_1..blob_T if asked}.
-- Errors: RB_EMPTY (no episode, or fewer than n without replacement), RB_INVALID, RB_LIMIT
-- (n above RB_MAX_ITEMS).
local meta, index, lens, steps = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local n = tonumber(ARGV[1])
if n == nil or n > RB_MAX_ITEMS then  -- redisbuf/store/bounds.py
  return fail('RB_LIMIT', 'one command draws at most ' .. RB_MAX_ITEMS .. ' episodes, asked '
    .. tostring(ARGV[1]))
end
if #ARGV[3] ~= 6 * n then return fail('RB_INVALID', 'expected ' .. n .. ' packed uniforms') end
local count = redis.call('ZCARD', index)
if count == 0 then return fail('RB_EMPTY', 'episode buffer is empty') end
local replace = ARGV[2] == '1'
if not replace and n > count then
  return fail('RB_EMPTY', 'asked for ' .. n .. ' episodes without replacement; ' .. count .. ' stored')
end
-- Eviction is oldest first only, so the stored ids are consecutive: rank r is id first + r.
local first = tonumber(redis.call('ZRANGE', index, 0, 0)[1])
local out = {redis.call('HGET', meta, 'schema')}
local swapped = {}
for i = 1, n do
  local u = uniform_at(ARGV[3], i)
  local rank
  if replace then
    rank = math.floor(u * count)
  else
    local j = (i - 1) + math.floor(u * (count - i + 1))
    rank = swapped[j] or j
    swapped[j] = swapped[i - 1] or (i - 1)
  end
  local id = id_str(first + rank)
  local start = tonumber(redis.call('ZSCORE', index, id))
  local length = tonumber(redis.call('HGET', lens, id))
  local entry = {id, start, length}
  if ARGV[4] == '1' then
    local blobs = read_steps(steps, start, length)
    for k = 1, length do entry[3 + k] = blobs[k] end
  end
  out[i + 1] = entry
end
if not RB_NO_WRITES then  -- read-only variant: no counter
  redis.call('HINCRBY', meta, 'sampled', n - (tonumber(ARGV[5]) or 0))
end
return out
