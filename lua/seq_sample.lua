-- Draw windows of consecutive stored steps; for prioritized draws, check and record the
-- window starts a sampling process drew from its replica of the step priorities.
-- @include common
-- @include masslog
-- @include correct
-- @include seq
-- @keys 10
-- @retry never
-- KEYS[1] meta  KEYS[2..10] steps, envs, episodes, begins, rewards, returns, prio,
-- masslog, snap
-- ARGV[1] L, the window length  ARGV[2] batch size  ARGV[3] recent_data_ratio (text)
-- ARGV[4] recent_data_steps  ARGV[5] "1" = windows may cross episode boundaries
-- ARGV[6] "1" = with replacement  ARGV[7] num_earliest_frames_ignored
-- ARGV[8] "1" = prioritized draws for the non-recent part
-- ARGV[9] packed uniforms (see uniform_at): batch size * (ARGV[10] + 1) of them suffice
-- ARGV[10] tries: candidate draws per window before the uniform part switches to exact
-- enumeration (inside episodes)
-- Prioritized only: ARGV[11] the replica's log_epoch  ARGV[12] its log_version
-- ARGV[13] its log_stamp  ARGV[14] S, spare draws per draw  ARGV[15] two uniforms per
-- draw, packed  ARGV[16] the replica's total mass  ARGV[17] the candidates, packed (see
-- unpack_ids): 1 + S slots per draw (one drawn from the replica, then S more), draw after
-- draw (as lua/sample_prioritized.lua's "correct" mode)  ARGV[18] their width
-- A window (e, p) is valid when steps p..p+L-1 are all stored, p >= oldest stored
-- position + num_earliest_frames_ignored and (unless crossing is allowed) all lie in one
-- episode. Recent windows also start among the last recent_data_steps possible starts of
-- their environment (ALF). Uniform parts draw uniformly among all valid windows (see
-- draw_uniform), without replacement when asked and possible.
-- The prioritized part: the process drew slots (see slot_of) in proportion to their
-- priority from its replica, at some version of the mass log. When the log has moved on
-- since, the draws are corrected to the priorities now (correct_draw, lua/_correct.lua):
-- each is then exactly an independent draw in proportion to the current priorities. The
-- draws are then taken in order, each kept when its slot's step starts a valid window,
-- until the part is full: the kept ones are independent draws of valid windows in
-- proportion to their first step's priority (exact conditional sampling); fewer come back
-- when the draws run out (the caller draws the rest in another call).
-- Returns {1, k_recent, k_normal, nonzero, prio_sum, epoch, version, stamp, corrected,
-- examined, env_1..env_k, pos_1..pos_k, priority_1..priority_k, entry_1...}: nonzero is
-- meta "nonzero", the stored steps of non-zero priority (prio_sum / nonzero is their
-- mean); epoch, version and stamp the log's ("" and 0 when the buffer is not
-- prioritized); corrected "1" when the draws were corrected, the log entries after the
-- replica's version following (its catch-up); examined the prioritized draws looked at
-- (kept or not). A prioritized draw that cannot stand returns what
-- lua/sample_prioritized.lua returns then, recording nothing: {3, epoch, version, stamp,
-- slots with holes, entries...} (the caller fills the holes, see there) or the replica's
-- catch-up {0, epoch, version, stamp, entries...}.
-- The caller reads the steps with HMGET afterwards: a field "e:p" only ever names step p
-- of env e (positions are never reused) and a window's episode membership never changes,
-- so that read finds the drawn window or, if it was evicted meanwhile, a missing step.
-- Adds k * L to meta "sampled" (steps drawn; not in the read-only variant).
-- Errors: RB_NOBUF, RB_EMPTY (no valid window), RB_INVALID, RB_NOLOG (prioritized draws
-- from a buffer that is not prioritized), RB_LIMIT (a batch of more than RB_MAX_ITEMS
-- windows, redisbuf/store/bounds.py).
local K = seq_keys(KEYS)
local C = seq_conf(K)
if not C then return fail('RB_NOBUF', 'sequence buffer meta ' .. K.meta .. ' does not exist') end
local L = tonumber(ARGV[1])
local batch = tonumber(ARGV[2])
if batch == nil or batch > RB_MAX_ITEMS then
  return fail('RB_LIMIT', 'one command draws at most ' .. RB_MAX_ITEMS .. ' windows, asked '
    .. tostring(ARGV[2]))
end
local ratio = tonumber(ARGV[3])
local recent_steps = tonumber(ARGV[4])
local cross = ARGV[5] == '1'
local replace = ARGV[6] == '1'
local ignored = tonumber(ARGV[7])
local prioritized = ARGV[8] == '1'
local packed = ARGV[9]
local tries = tonumber(ARGV[10])
local conf = redis.call('HMGET', K.meta, 'size', 'nonzero', 'prio_sum', 'prio_comp', 'masslog',
  'log_epoch', 'log_version', 'log_stamp', 'per_alpha', 'per_eps')
local size = tonumber(conf[1]) or 0
local nonzero = tonumber(conf[2]) or 0
local prio_sum = (tonumber(conf[3]) or 0) + (tonumber(conf[4]) or 0)
if prioritized and conf[5] ~= '1' then
  return fail('RB_NOLOG', 'sequence buffer ' .. K.meta .. ' is not prioritized')
end

local starts, nexts = {}, {}
do
  local fields = {}
  for e = 0, C.num_envs - 1 do
    fields[#fields + 1] = 'start:' .. e
    fields[#fields + 1] = 'next:' .. e
  end
  local raw = hmget_chunked(K.envs, fields)
  for e = 0, C.num_envs - 1 do
    starts[e] = tonumber(raw[2 * e + 1]) or 0
    nexts[e] = tonumber(raw[2 * e + 2]) or 0
  end
end

-- ALF draws a recent part only when ordinary draws would rarely reach recent data
local n_recent = 0
if ratio > 0 then
  local average = size / C.num_envs - (L - 1 + ignored)
  if average * ratio > recent_steps then n_recent = math.ceil(batch * ratio) end
end
local n_normal = batch - n_recent

-- Candidate ranges of window starts: {env, lo, cumulative count}, and their total. By
-- environment, every constraint but the episode one (`by_episode` = false), or by
-- episode, exactly the valid windows (`by_episode` = true, O(number of episodes)).
local function candidates(recent, by_episode)
  local out, total = {}, 0
  local function push(e, lo, last)
    lo = math.max(lo, starts[e] + ignored)
    if recent then lo = math.max(lo, nexts[e] - L + 1 - recent_steps) end
    local count = last - L + 2 - lo
    if count > 0 then
      total = total + count
      out[#out + 1] = {e, lo, total}
    end
  end
  if by_episode then
    local entries = redis.call('ZRANGEBYSCORE', K.episodes, L, '+inf', 'WITHSCORES')
    for i = 1, #entries, 2 do
      local e, begin = parse_member(entries[i])
      local lo = math.max(begin, starts[e])
      push(e, lo, lo + tonumber(entries[i + 1]) - 1)
    end
  else
    for e = 0, C.num_envs - 1 do push(e, starts[e], nexts[e] - 1) end
  end
  return out, total
end

-- The window start of rank `rank` among the candidate ranges.
local function locate(ranges, rank)
  local a, b = 1, #ranges
  while a < b do
    local m = math.floor((a + b) / 2)
    if ranges[m][3] > rank then b = m else a = m + 1 end
  end
  local before = a > 1 and ranges[a - 1][3] or 0
  return ranges[a][1], ranges[a][2] + rank - before
end

local function in_one_episode(e, p)
  local _, last = episode_of(K, e, p, {start = starts[e]})
  return p + L - 1 <= last
end

local envs, positions, priorities = {}, {}, {}
local cursor = 0  -- uniforms used so far
local function next_uniform()
  cursor = cursor + 1
  if 6 * cursor > #packed then return nil end
  return uniform_at(packed, cursor)
end
local short = fail('RB_INVALID', 'too few packed uniforms')

-- Exact draws over ranges that hold only valid windows: sparse Fisher-Yates over ranks
-- without replacement, independent ranks with it.
local function draw_exact(n, ranges, total)
  local without = (not replace) and n <= total
  local swapped = {}
  for i = 1, n do
    local u = next_uniform()
    if u == nil then return short end
    local rank
    if without then
      local j = (i - 1) + math.floor(u * (total - i + 1))
      rank = swapped[j] or j
      swapped[j] = swapped[i - 1] or (i - 1)
    else
      rank = math.floor(u * total)
    end
    local e, p = locate(ranges, rank)
    envs[#envs + 1] = e
    positions[#positions + 1] = p
    priorities[#priorities + 1] = '1'
  end
  return true
end

-- Uniform draws over valid windows. Within episodes, first by rejection: candidates
-- uniform over the per-environment ranges, kept when inside one episode (and new,
-- without replacement); by symmetry the kept windows are uniform whether or not the
-- budget of n * tries candidates suffices. When it does not (short episodes), the draws
-- are discarded and made exactly over the episode list.
local function draw_uniform(n, recent)
  if n <= 0 then return true end
  local ranges, total = candidates(recent, false)
  if total == 0 then return false end
  if cross then return draw_exact(n, ranges, total) end
  local kept, seen, first = 0, {}, #envs
  for _ = 1, n * tries do
    if kept == n then break end
    local u = next_uniform()
    if u == nil then return short end
    local e, p = locate(ranges, math.floor(u * total))
    local key = e .. ':' .. p
    if (replace or not seen[key]) and in_one_episode(e, p) then
      seen[key] = true
      kept = kept + 1
      envs[#envs + 1] = e
      positions[#positions + 1] = p
      priorities[#priorities + 1] = '1'
    end
  end
  if kept == n then return true end
  for i = #envs, first + 1, -1 do
    envs[i], positions[i], priorities[i] = nil, nil, nil
  end
  ranges, total = candidates(recent, true)
  if total == 0 then return false end
  return draw_exact(n, ranges, total)
end

local function valid_start(e, p)
  if p < starts[e] + ignored or p + L - 1 > nexts[e] - 1 then return false end
  return cross or in_one_episode(e, p)
end

-- The prioritized draws as they stand at this call: the replica's own when its version
-- is current, else corrected (nil and a reply to return when they cannot stand).
local corrected, entries = '0', {}
local function prioritized_draws()
  local out, stand = draws_at_commit(K, {conf[6], conf[7], conf[8]},
    {ARGV[11], ARGV[12], ARGV[13], tonumber(ARGV[16])},
    {true, tonumber(conf[9]) or 1, tonumber(conf[10]) or 0, 0},
    ARGV[17], tonumber(ARGV[18]), tonumber(ARGV[14]), ARGV[15])
  if not out then return nil, stand end
  entries = stand
  if #entries > 0 then corrected = '1' end
  return out
end

-- Keep the draws (slots, in order) whose steps start valid windows, n at most.
local examined = 0
local function keep_valid(n, slots)
  local kept = {}
  for _, text in ipairs(slots) do
    if #kept == n then break end
    examined = examined + 1
    local slot = tonumber(text)
    local e = math.floor(slot / C.max_length)
    local index = slot % C.max_length
    if e < C.num_envs then
      local p = starts[e] + (index - starts[e]) % C.max_length
      if p < nexts[e] and valid_start(e, p) then
        kept[#kept + 1] = text
        envs[#envs + 1] = e
        positions[#positions + 1] = p
      end
    end
  end
  local found = hmget_chunked(K.prio, kept)
  for i = 1, #kept do priorities[#priorities + 1] = found[i] or '0' end
end

local drawn
if prioritized then
  -- no window at all (every constraint but the episode one): nothing to draw
  local _, total = candidates(false, false)
  if total == 0 then
    return fail('RB_EMPTY', 'no stored window of ' .. L .. ' steps'
      .. (cross and '' or ' inside one episode'))
  end
  local stand
  drawn, stand = prioritized_draws()
  if not drawn then return stand end
end

local ok = draw_uniform(n_recent, true)
if type(ok) == 'table' then return ok end
if not ok then
  -- no recent window: draw the whole batch the ordinary way
  n_recent, n_normal = 0, batch
end
if prioritized then
  keep_valid(n_normal, drawn)
  ok = true
else
  ok = draw_uniform(n_normal, false)
end
if type(ok) == 'table' then return ok end
if not ok then
  return fail('RB_EMPTY', 'no stored window of ' .. L .. ' steps'
    .. (cross and '' or ' inside one episode'))
end

local k = #envs
-- meta "sampled" counts the steps of the windows drawn, for the rate history (steps, as
-- seq_add counts); the read-only variant (full server, replica) counts nothing
if not RB_NO_WRITES then redis.call('HINCRBY', K.meta, 'sampled', k * L) end
local out = {1, n_recent, k - n_recent, nonzero, fmt(prio_sum), conf[6] or '', conf[7] or '0',
  conf[8] or '', corrected, examined}
for w = 1, k do out[#out + 1] = envs[w] end
for w = 1, k do out[#out + 1] = positions[w] end
for w = 1, k do out[#out + 1] = priorities[w] end
for i = 1, #entries do out[#out + 1] = entries[i] end
return out
