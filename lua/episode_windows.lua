-- Draw windows of `length` consecutive steps of one stored episode, uniformly over all
-- such windows (an episode of T steps holds T - length + 1 of them), and return them.
-- @include common
-- @include episodes
-- @keys 4
-- @retry never
-- KEYS[1] meta  KEYS[2] index  KEYS[3] lens  KEYS[4] steps
-- ARGV[1] n  ARGV[2] length  ARGV[3] tries: rejection draws per window before the exact
-- fallback  ARGV[4] n * (tries + 1) uniforms in [0, 1), packed 6 bytes each
-- A try draws a uniform live position and keeps it if a window starting there fits in
-- its episode (uniform over windows given acceptance); after `tries` misses one exact
-- draw over every episode's window count is made, so every window is equally likely.
-- ARGV[5] "1" = also return the blobs (atomic), "0" = only where the windows are (a step
-- position is never reused and an episode's steps go in one script, so a later HMGET of
-- a window's positions finds all its steps or none)
-- ARGV[6] (optional, default 0) windows of the caller's previous attempt that it threw
-- away (evicted before its HMGET) and draws again here: taken off meta `sampled`
-- Returns {schema text, entry_1..entry_n}, one entry per window: {episode id, offset of
-- its first step in the episode, position of that step, blob_1..blob_length if asked}.
-- Errors: RB_EMPTY (no stored episode has `length` steps), RB_INVALID, RB_LIMIT (n * length
-- above RB_MAX_ITEMS).
local meta, index, lens, steps = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local n, length, tries = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local U = ARGV[4]
if n == nil or length == nil or n * length > RB_MAX_ITEMS then  -- redisbuf/store/bounds.py
  return fail('RB_LIMIT', 'one command reads at most ' .. RB_MAX_ITEMS .. ' steps, asked '
    .. tostring(ARGV[1]) .. ' windows of ' .. tostring(ARGV[2]))
end
if #U ~= 6 * n * (tries + 1) then
  return fail('RB_INVALID', 'expected ' .. n * (tries + 1) .. ' packed uniforms')
end
if length < 1 then return fail('RB_INVALID', 'window length must be >= 1') end
if redis.call('ZCARD', index) == 0 then return fail('RB_EMPTY', 'episode buffer is empty') end
local first_pos = tonumber(redis.call('ZRANGE', index, 0, 0, 'WITHSCORES')[2])
local live = tonumber(redis.call('HGET', meta, 'next_pos')) - first_pos

local table_ids, table_starts, table_cum  -- exact fallback, built on first use
local function exact(u)
  if not table_ids then
    table_ids, table_starts, table_cum = {}, {}, {}
    local all = redis.call('ZRANGE', index, 0, -1, 'WITHSCORES')
    local ids = {}
    for i = 1, #all, 2 do ids[#ids + 1] = all[i] end
    local all_lens = hmget_chunked(lens, ids)
    local total = 0
    for k = 1, #ids do
      local windows = tonumber(all_lens[k]) - length + 1
      if windows > 0 then
        total = total + windows
        table_ids[#table_ids + 1] = ids[k]
        table_starts[#table_starts + 1] = tonumber(all[2 * k])
        table_cum[#table_cum + 1] = total
      end
    end
  end
  local total = table_cum[#table_cum]
  if not total then return nil end
  local target = math.floor(u * total)  -- 0 .. total - 1
  local lo, hi = 1, #table_cum
  while lo < hi do  -- first k with cum[k] > target
    local mid = math.floor((lo + hi) / 2)
    if table_cum[mid] > target then hi = mid else lo = mid + 1 end
  end
  local before = (lo > 1) and table_cum[lo - 1] or 0
  return table_ids[lo], table_starts[lo], target - before
end

local out = {redis.call('HGET', meta, 'schema')}
for i = 1, n do
  local base = (i - 1) * (tries + 1)
  local id, start, offset
  for k = 1, tries do
    local p = first_pos + math.floor(uniform_at(U, base + k) * live)
    local hit = redis.call('ZREVRANGEBYSCORE', index, pos_str(p), '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
    local s = tonumber(hit[2])
    if p + length <= s + tonumber(redis.call('HGET', lens, hit[1])) then
      id, start, offset = hit[1], s, p - s
      break
    end
  end
  if not id then
    id, start, offset = exact(uniform_at(U, base + tries + 1))
    if not id then
      return fail('RB_EMPTY', 'no stored episode has ' .. length .. ' steps')
    end
  end
  local entry = {id, offset, start + offset}
  if ARGV[5] == '1' then
    local blobs = read_steps(steps, start + offset, length)
    for k = 1, length do entry[3 + k] = blobs[k] end
  end
  out[i + 1] = entry
end
if not RB_NO_WRITES then  -- read-only variant: no counter
  redis.call('HINCRBY', meta, 'sampled', n - (tonumber(ARGV[6]) or 0))
end
return out
