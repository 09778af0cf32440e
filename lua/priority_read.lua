-- The current PER priority of items, for any client (FCALL_RO rb_priority, `redisbuf
-- inspect --priority`): the server keeps no per-item priority, so it is read from where
-- the priorities are, the mass log and the snapshot behind it (lua/_masslog.lua).
-- @include common
-- @include masslog
-- @include snapshot
-- @keys 6
-- @retry safe
-- KEYS[1] meta  KEYS[2] order  KEYS[3] masslog  KEYS[4] snap  KEYS[5] perheap  KEYS[6] per
-- ARGV[1..] item ids (decimal; at most RB_PRIORITY_IDS of them)
-- For each id: not stored (not in the order zset) -> false; else its newest mention in the
-- log (a C row's new score, or a U row's priority: an id stored now and named by no C row
-- since was stored at that U row), searched from the newest entry back; else its score in
-- the snapshot of this epoch; else (no snapshot of the epoch) the epoch's base priority
-- (meta per_base: what PER gave the items present when it was turned on) or, on a buffer
-- of the earlier layout, its per hash. While the priority heap is kept (meta per_heap =
-- 1) it is read from there. Work: O(ids x the log's bytes) (plain searches, in C) plus
-- one snapshot page per id; read-only.
-- Returns one priority (text, %.17g) or false per id.
-- Errors: RB_NOBUF, RB_CONFIG (no PER), RB_INVALID (an id that is not a positive
-- integer), RB_LIMIT (more than RB_PRIORITY_IDS ids).
local RB_PRIORITY_IDS = 16
refuse_while_applying(KEYS[1])
local meta, order, masslog, snap, heap, legacy = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local conf = redis.call('HMGET', meta, 'capacity', 'mass', 'log_epoch', 'per_heap', 'per_base',
  'per_legacy', 'per_initial', 'log_first')
if not conf[1] then return fail('RB_NOBUF', 'buffer meta ' .. meta .. ' does not exist') end
if conf[2] ~= 'per' then
  return fail('RB_CONFIG', 'buffer ' .. meta .. ' has no PER priorities (use PERSampler)')
end
if #ARGV > RB_PRIORITY_IDS then
  return fail('RB_LIMIT', 'one call reads at most ' .. RB_PRIORITY_IDS .. ' priorities, got '
    .. #ARGV)
end
local out, open, wanted = {}, {}, {}
for i = 1, #ARGV do
  local n = tonumber(ARGV[i])
  if n == nil or n < 1 or n >= 1e12 or n ~= math.floor(n) then
    return fail('RB_INVALID', 'item id ' .. tostring(ARGV[i]) .. ' is not a positive integer')
  end
  local id = id_str(n)
  out[i] = false
  if redis.call('ZSCORE', order, id) then
    if conf[4] == '1' then
      out[i] = redis.call('ZSCORE', heap, id)
    else
      open[#open + 1] = i
      wanted[i] = {id, n}
    end
  end
end

-- The newest row of `entry` naming id (12 digits): its score (a number, or 'nan'), or nil.
local function mention(entry, id)
  local kind = string.sub(entry, 1, 1)
  if kind == 'X' or (kind ~= 'V' and not string.find(entry, id, 1, true)) then return nil end
  local p1 = string.find(entry, '|', 3, true)
  local p2 = string.find(entry, '|', p1 + 1, true)
  local k = tonumber(string.sub(entry, 3, p1 - 1))
  if kind == 'V' then  -- the last of the k 8-byte ids that is id; the bytes may also
    -- occur across two ids or among the doubles, so only aligned finds count
    local needle, found, from = id_bytes(id), nil, p2 + 1
    while true do
      local at = string.find(entry, needle, from, true)
      if not at or at > p2 + 8 * k - 7 then break end
      if (at - p2 - 1) % 8 == 0 then found = math.floor((at - p2 - 1) / 8) + 1 end
      from = at + 1
    end
    if found then return double_at(entry, p2 + 8 * k + 8 * found - 7) end
    return nil
  end
  if kind == 'U' then
    local found = nil
    for i = 1, k do
      if string.sub(entry, p2 + 12 * i - 11, p2 + 12 * i) == id then found = i end
    end
    if found then return double_at(entry, p2 + 12 * k + 8 * found - 7) end
    return nil
  end
  local p3 = string.find(entry, '|', p2 + 1, true)
  local p4 = string.find(entry, '|', p3 + 1, true)
  local ids, new = {}, {}
  if kind == 'P' then
    for i = 1, k do ids[i] = string.sub(entry, p2 + 12 * i - 11, p2 + 12 * i) end
    for v in string.gmatch(string.sub(entry, p3 + 1, p4 - 1), '[^,]+') do new[#new + 1] = v end
  else
    for v in string.gmatch(string.sub(entry, p2 + 1, p3 - 1), '[^,]+') do ids[#ids + 1] = v end
    for v in string.gmatch(string.sub(entry, p4 + 1), '[^,]+') do new[#new + 1] = v end
  end
  local found = nil
  for i = 1, #ids do
    if ids[i] == id then found = i end
  end
  if not found then return nil end
  return new[found] or new[1] or 'nan'
end

local length = redis.call('LLEN', masslog)
local stop = length
while #open > 0 and stop > 0 do
  local entries = redis.call('LRANGE', masslog, math.max(0, stop - 256), stop - 1)
  for e = #entries, 1, -1 do
    local still = {}
    for _, i in ipairs(open) do
      local score = mention(entries[e], wanted[i][1])
      if score == nil then
        still[#still + 1] = i
      elseif score ~= 'nan' then
        out[i] = type(score) == 'number' and fmt(score) or fmt(tonumber(score))
      end
    end
    open = still
    if #open == 0 then break end
  end
  stop = stop - #entries
end
if #open > 0 then  -- named by no entry the log holds: the snapshot's, else the base
  local S = snapshot_open(snap, conf[3])
  for _, i in ipairs(open) do
    local score = nil
    if S then score = snapshot_score(S, wanted[i][2]) end
    if score then
      out[i] = fmt(score)
    elseif score == nil and not S and conf[8] == '1' then
      if conf[6] == '1' then
        out[i] = redis.call('HGET', legacy, wanted[i][1]) or fmt(tonumber(conf[7]) or 1)
      else
        out[i] = fmt(tonumber(conf[5] or conf[7]) or 1)
      end
    end
  end
end
return out
