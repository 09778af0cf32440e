-- Correcting a replica's draw with replacement to the law at the commit, a helper
-- scripts name with "-- @include correct". Used by lua/sample_prioritized.lua (items) and
-- lua/seq_sample.lua (SequenceBuffer's window starts): the ids are whatever the mass log's
-- entries name (item ids, step slots), compared as text.
-- @include common
-- @include masslog

local function split(text)
  local out = {}
  for part in string.gmatch(text, '[^,]+') do out[#out + 1] = part end
  return out
end

-- The mass of a logged score (text, "nan" when not present; or a number) under the rule,
-- as the replica weighs it (redisbuf/sampling/replica.py masses_of): a PER mass above
-- PER_SUM_CAP (or +inf) counts as the cap.
local function mass_of(text, per, alpha, eps, ref)
  if text == 'nan' then return 0 end
  local score = text
  if type(text) == 'string' then score = to_number(text) end
  if per then
    local base = score + eps
    if not (base > 0) then return 0 end
    return math.min(base ^ alpha, PER_SUM_CAP)
  end
  if score == -math.huge then return 0 end
  return math.exp(score - ref)
end

-- The items log entries name, in order of first mention, with each one's score before
-- the first entry (its first row's old) and after the last (its last row's new), as text
-- ('nan': not present); nil when an entry is an X.
local function touched_scores(entries)
  local first_old, last_new, list = {}, {}, {}
  for _, entry in ipairs(entries) do
    if string.sub(entry, 1, 1) == 'X' then return nil end
    local p1 = string.find(entry, '|', 3, true)
    local p2 = string.find(entry, '|', p1 + 1, true)
    local p3 = string.find(entry, '|', p2 + 1, true)
    local p4 = string.find(entry, '|', p3 + 1, true)
    local ids, old, new
    if string.sub(entry, 1, 1) == 'P' then  -- ids packed, new as text, old as IEEE bits
      ids = unpack_ids(string.sub(entry, p2 + 1, p3 - 1), 12)
      new = split(string.sub(entry, p3 + 1, p4 - 1))
      old = {}
      for i = 1, #ids do
        old[i] = number_of_bits(string.sub(entry, p4 + 16 * i - 15, p4 + 16 * i))
      end
    else
      ids = split(string.sub(entry, p2 + 1, p3 - 1))
      old = split(string.sub(entry, p3 + 1, p4 - 1))
      new = split(string.sub(entry, p4 + 1))
    end
    for i, id in ipairs(ids) do
      if first_old[id] == nil then
        first_old[id] = old[i] or 'nan'
        list[#list + 1] = id
      end
      last_new[id] = new[i] or new[1] or 'nan'
    end
  end
  return first_old, last_new, list
end

-- The draw of a replica at an earlier version corrected to the current law, given the
-- log entries since that version: the items they name ("touched": added, re-scored or
-- removed) are the only ones whose mass changed, and the entries give each one's score
-- at that version (its first row's old) and now (its last row's new). Each draw
-- independently: with probability (mass now of the touched items) / (total mass now), a
-- touched item in proportion to its mass now (its first uniform decides, its second
-- picks); else a candidate not touched: its own first, else the first unused one of the
-- spare pool (every candidate is an independent draw of the replica, whose masses are
-- still those of the untouched items, so among them they follow the current law); when
-- those run out too, a hole ('') that the caller fills with a draw among the untouched
-- items (returned second: whether there is one). Nil when an entry is an X, no mass is
-- left or the masses now are not finite numbers relative to the replica's reference.
local function correct_draw(entries, per, alpha, eps, ref, total, candidates, spares,
                            uniforms)
  local first_old, last_new, list = touched_scores(entries)
  if not first_old then return nil end
  local live, cumulative, changed = {}, {}, 0
  for _, id in ipairs(list) do
    total = total + mass_of(last_new[id], per, alpha, eps, ref)
      - mass_of(first_old[id], per, alpha, eps, ref)
    local m = mass_of(last_new[id], per, alpha, eps, ref)
    if m > 0 then
      changed = changed + m
      live[#live + 1] = id
      cumulative[#live] = changed
    end
  end
  -- a touched log-reward far above the replica's reference (exp overflows; +inf) cannot
  -- be weighed against the replica's masses: the replica catches up (re-bases) instead
  if total <= 0 or total == math.huge or total ~= total or changed == math.huge
      or changed > total * (1 + 1e-9) then
    return nil
  end
  local width = 1 + spares
  local n = #candidates / width
  local out, used, pool, holes = {}, {}, 1, false
  local function untouched(k)
    local id = candidates[k]
    return first_old[id] == nil and not used[k]
  end
  for j = 1, n do
    if #live > 0 and uniform_at(uniforms, 2 * j - 1) * total < changed then
      local target = uniform_at(uniforms, 2 * j) * changed
      local lo, hi = 1, #live
      while lo < hi do  -- the first cumulative mass above the target
        local mid = math.floor((lo + hi) / 2)
        if cumulative[mid] > target then hi = mid else lo = mid + 1 end
      end
      out[j] = live[lo]
    else
      for k = width * (j - 1) + 1, width * j do
        if untouched(k) then
          out[j], used[k] = candidates[k], true
          break
        end
      end
      if not out[j] then  -- its own candidates were all touched: one from the spare pool
        while pool <= #candidates and not untouched(pool) do pool = pool + 1 end
        if pool <= #candidates then
          out[j], used[pool] = candidates[pool], true
        else
          out[j], holes = '', true  -- the caller fills it among the untouched items
        end
      end
    end
  end
  return out, holes
end

-- The draws of a commit in "correct" mode as they stand at this call, the one check and
-- correction of lua/sample_prioritized.lua and lua/seq_sample.lua. `log`: the buffer's
-- {log_epoch, log_version, log_stamp} (meta); `replica`: the sender's {epoch, version,
-- stamp, total mass} (its ARGV, as text but the total); `mass`: {per, alpha, eps, ref}
-- (see correct_draw); `packed` / `width`: the candidates (see unpack_ids), 1 + `spares`
-- per draw, draw after draw; `uniforms`: two per draw (see correct_draw). Returns the
-- draws, the log entries they were corrected by ({} when the log is at the replica's
-- epoch, version and stamp: the draws are then each draw's first candidate) and each
-- draw's first candidate. When they cannot stand, nil and the reply to return (nothing
-- is recorded): the replica's catch-up (masslog_behind) when it cannot catch up from the
-- log, is further behind than one reply carries or the entries hold an X; {3, epoch,
-- version, stamp, draws with '' at each hole, entries...} when a correction left holes.
local function draws_at_commit(K, log, replica, mass, packed, width, spares, uniforms)
  local candidates = unpack_ids(packed, width)
  local stride = 1 + spares
  local sent = {}
  for j = 1, #candidates / stride do sent[j] = candidates[stride * (j - 1) + 1] end
  if log[1] == replica[1] and log[2] == replica[2] and log[3] == replica[3] then
    return sent, {}, sent
  end
  local behind = masslog_behind(K, replica[1], tonumber(replica[2]), replica[3])
  if #behind == 4 or #behind - 4 ~= tonumber(behind[3]) - tonumber(replica[2]) then
    return nil, behind  -- cannot catch up from the log, or too far behind for one reply
  end
  local entries = {}
  for i = 5, #behind do entries[#entries + 1] = behind[i] end
  local ids, holes = correct_draw(entries, mass[1], mass[2], mass[3], mass[4], replica[4],
    candidates, spares, uniforms)
  if not ids then return nil, behind end
  if holes then  -- nothing is recorded: the caller completes the draw and commits it
    local out = {3, log[1] or '', log[2] or '0', log[3] or '', table.concat(ids, ',')}
    for i = 1, #entries do out[#out + 1] = entries[i] end
    return nil, out
  end
  return ids, entries, sent
end

-- Draws without replacement as a race: item i arrives at an exponential time of rate its
-- mass, and successive draws are the items in order of arrival. A replica's first m
-- arrivals with their times (`candidates`, `times` ascending: every arrival up to the
-- last time is among them) are corrected to the law now by the log entries since the
-- replica's version: each touched item (added, re-scored or removed) arrives at a fresh
-- time of rate its mass now (the j-th of them with mass by the j-th uniform of `pool`;
-- never when its mass is 0), every other candidate at its own; when at least n times up
-- to the last candidate's are known, the first n arrivals are the draw. Returns it; else
-- nil and every known arrival (ids, times: the untouched candidates' and each touched
-- item's with mass), for the caller to run the race on from the last candidate's time
-- (its other items arrive after it); false when the entries cannot correct it (an X
-- entry, a mass now that is not a finite number, more touched items than uniforms).
local function correct_successive(entries, per, alpha, eps, ref, candidates, times, n, pool)
  local first_old, last_new, list = touched_scores(entries)
  if not first_old then return false end
  local last = times[#times]
  local ids, at = {}, {}
  for k, id in ipairs(candidates) do
    if first_old[id] == nil then
      ids[#ids + 1] = id
      at[#at + 1] = times[k]
    end
  end
  local j, known = 0, #ids
  for _, id in ipairs(list) do
    local m = mass_of(last_new[id], per, alpha, eps, ref)
    if m == math.huge or m ~= m then return false end
    if m > 0 then
      j = j + 1
      if 6 * j > #pool then return false end
      local t = -math.log(1 - uniform_at(pool, j)) / m
      ids[#ids + 1] = id
      at[#at + 1] = t
      if t <= last then known = known + 1 end
    end
  end
  if known < n then return nil, ids, at end
  local order = {}
  for i = 1, #ids do order[i] = i end
  table.sort(order, function(a, b) return at[a] < at[b] end)
  local out = {}
  for i = 1, n do out[i] = ids[order[i]] end
  return out
end

-- The draws of a commit in "successive" mode (without replacement) as they stand at this
-- call, as draws_at_commit for "correct": `packed` / `width` the replica's first arrivals
-- (see correct_successive), `times_text` their times (comma-separated), `n` the draws,
-- `pool` the uniforms of touched items' times. Returns the draws, the entries they were
-- corrected by ({}: the first n candidates stand as sent) and the first n candidates; or
-- nil and the reply: the replica's catch-up (masslog_behind) when the log cannot correct
-- the draw, or {3, epoch, version, stamp, "id:time,..." (every known arrival),
-- entries...} when fewer than n arrivals are known up to the last candidate's time
-- (nothing is recorded: the caller, caught up, runs the race on and commits again).
local function successive_at_commit(K, log, replica, mass, packed, width, n, times_text, pool)
  local candidates = unpack_ids(packed, width)
  local sent = {}
  for j = 1, n do sent[j] = candidates[j] end
  if log[1] == replica[1] and log[2] == replica[2] and log[3] == replica[3] then
    return sent, {}, sent
  end
  local behind = masslog_behind(K, replica[1], tonumber(replica[2]), replica[3])
  if #behind == 4 or #behind - 4 ~= tonumber(behind[3]) - tonumber(replica[2]) then
    return nil, behind
  end
  local entries = {}
  for i = 5, #behind do entries[#entries + 1] = behind[i] end
  local times = {}
  for part in string.gmatch(times_text, '[^,]+') do times[#times + 1] = tonumber(part) end
  local ids, known, at = correct_successive(entries, mass[1], mass[2], mass[3], mass[4],
    candidates, times, n, pool)
  if ids == false then return nil, behind end
  if not ids then
    local arrivals = {}
    for i = 1, #known do arrivals[i] = known[i] .. ':' .. fmt(at[i]) end
    local out = {3, log[1] or '', log[2] or '0', log[3] or '', table.concat(arrivals, ',')}
    for i = 1, #entries do out[#out + 1] = entries[i] end
    return nil, out
  end
  return ids, entries, sent
end
