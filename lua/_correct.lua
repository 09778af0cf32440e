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

-- The mass of a score (a number, or text: "nan" when not present) under the rule, as the
-- replica weighs it (redisbuf/sampling/replica.py masses_of): a PER mass above
-- PER_SUM_CAP (or +inf) counts as the cap.
local function mass_of(score, per, alpha, eps, ref)
  if score == 'nan' then return 0 end
  if type(score) == 'string' then score = to_number(score) end
  if per then
    local base = score + eps
    if not (base > 0) then return 0 end
    return math.min(base ^ alpha, PER_SUM_CAP)
  end
  if score == -math.huge then return 0 end
  return math.exp(score - ref)
end

-- The items the log entries since a replica's version name ("touched": the only ones whose
-- mass may have changed) with their mass now: {list of ids, id -> mass now, id -> true
-- for an id whose presence the entries leave open, id -> score now}, or nil when an entry
-- is an X. A C
-- row sets its id (present with a score, or removed: "nan"); a U or V row (or a P row of
-- earlier versions) re-scores its id only if stored at that point: for an id a C row
-- named before, the entries say whether it was; for one they have not named, it was
-- stored there exactly when it is stored now (nothing since added or removed it), which
-- they leave open: its mass counts as if present, and the caller checks presence only
-- where such an id is drawn.
local function touched_masses(entries, per, alpha, eps, ref)
  local score, certain, list = {}, {}, {}
  local function note(id)
    if score[id] == nil then list[#list + 1] = id end
  end
  for _, entry in ipairs(entries) do
    local kind = string.sub(entry, 1, 1)
    if kind == 'X' then return nil end
    local p1 = string.find(entry, '|', 3, true)
    local p2 = string.find(entry, '|', p1 + 1, true)
    if kind == 'U' or kind == 'V' then  -- k ids (12 digits, or 8 bytes), k doubles
      local k = tonumber(string.sub(entry, 3, p1 - 1))
      local width = kind == 'U' and 12 or 8
      local base = p2 + width * k
      for i = 1, k do
        local id
        if kind == 'U' then id = string.sub(entry, p2 + 12 * i - 11, p2 + 12 * i)
        else id = id_at(entry, p2 + 8 * i - 7) end  -- nil: no item has it
        if id and (not certain[id] or score[id] ~= 'nan') then
          note(id)
          score[id] = double_at(entry, base + 8 * i - 7)
        end
      end
    else
      local p3 = string.find(entry, '|', p2 + 1, true)
      local p4 = string.find(entry, '|', p3 + 1, true)
      local ids, new
      if kind == 'P' then  -- (earlier versions) ids packed, new as text, all present
        ids = unpack_ids(string.sub(entry, p2 + 1, p3 - 1), 12)
        new = split(string.sub(entry, p3 + 1, p4 - 1))
      else
        ids = split(string.sub(entry, p2 + 1, p3 - 1))
        new = split(string.sub(entry, p4 + 1))
      end
      for i, id in ipairs(ids) do
        note(id)
        score[id] = new[i] or new[1] or 'nan'
        certain[id] = true
      end
    end
  end
  local masses, open = {}, {}
  for _, id in ipairs(list) do
    masses[id] = mass_of(score[id], per, alpha, eps, ref)
    if not certain[id] then open[id] = true end
  end
  return {list, masses, open, score}
end

-- The draw of a replica at an earlier version corrected to the current law, given the
-- log entries since that version (touched_masses: the items they name are the only ones
-- whose mass changed; D, the mass now of those). Each draw independently repeats, until
-- it ends: with probability D / (T + D) (T the replica's total mass) it ends on a touched
-- item drawn in proportion to its mass now; else it takes its next candidate (its own,
-- then the first unused one of the spare pool: every candidate is an independent draw of
-- the replica) and ends on it if untouched, or goes on if touched. An untouched item's
-- mass is the replica's, so each round ends on item i with probability proportional to
-- its mass now: the draw follows the current law exactly, without the replica's masses of
-- the touched items. The coin of the next round is the last one's, rescaled (uniform and
-- independent of what it decided). Where the candidates run out, or the touched item
-- drawn turns out absent (`present`, asked only for the ids touched_masses left open; nil
-- when none can be), a hole ('') that the caller fills with a fresh draw at the current
-- law: what the rounds would have ended on. Returns the draws and whether any is a hole;
-- nil when an entry is an X, or the masses now are not finite numbers relative to the
-- replica's (a softmax reference far below a new log-reward).
local function correct_draw(entries, per, alpha, eps, ref, total, candidates, spares,
                            uniforms, present)
  local touched = touched_masses(entries, per, alpha, eps, ref)
  if not touched then return nil end
  local list, masses, open = touched[1], touched[2], touched[3]
  local live, cumulative, changed = {}, {}, 0
  for _, id in ipairs(list) do
    local m = masses[id]
    if m > 0 then
      changed = changed + m
      live[#live + 1] = id
      cumulative[#live] = changed
    end
  end
  if not (total >= 0) or total == math.huge or changed == math.huge or changed ~= changed
      or total + changed <= 0 then
    return nil
  end
  local q = changed / (total + changed)
  local width = 1 + spares
  local n = #candidates / width
  local out, used, pool, holes, known = {}, {}, 1, false, {}
  local function next_candidate(j)
    for k = width * (j - 1) + 1, width * j do
      if not used[k] then
        used[k] = true
        return candidates[k]
      end
    end
    while pool <= #candidates and used[pool] do pool = pool + 1 end
    if pool > #candidates then return nil end
    used[pool] = true
    return candidates[pool]
  end
  for j = 1, n do
    local coin = uniform_at(uniforms, 2 * j - 1)
    while true do
      if coin < q then
        local target = uniform_at(uniforms, 2 * j) * changed
        local lo, hi = 1, #live
        while lo < hi do  -- the first cumulative mass above the target
          local mid = math.floor((lo + hi) / 2)
          if cumulative[mid] > target then hi = mid else lo = mid + 1 end
        end
        local id = live[lo]
        if open[id] then
          if known[id] == nil then known[id] = present ~= nil and present(id) end
          if not known[id] then id = '' end  -- never stored here: drawn afresh
        end
        out[j] = id
        break
      end
      coin = (coin - q) / (1 - q)
      local id = next_candidate(j)
      if id == nil then
        out[j] = ''
        break
      end
      if masses[id] == nil then
        out[j] = id
        break
      end
    end
    if out[j] == '' then holes = true end
  end
  return out, holes
end

-- The draws of a commit in "correct" mode as they stand at this call, the one check and
-- correction of lua/sample_prioritized.lua and lua/seq_sample.lua. `log`: the buffer's
-- {log_epoch, log_version, log_stamp} (meta); `replica`: the sender's {epoch, version,
-- stamp, total mass} (its ARGV, as text but the total); `mass`: {per, alpha, eps, ref}
-- (see correct_draw); `packed` / `width`: the candidates (see unpack_ids), 1 + `spares`
-- per draw, draw after draw; `uniforms`: two per draw (see correct_draw); `present`: see
-- correct_draw. Returns the draws, the log entries they were corrected by ({} when the log
-- is at the replica's epoch, version and stamp: the draws are then each draw's first
-- candidate) and each draw's first candidate. When they cannot stand, nil and the reply to
-- return (nothing is recorded): the replica's catch-up (masslog_behind) when it cannot
-- catch up from the log, is further behind than one reply carries or the entries hold an
-- X; {3, epoch, version, stamp, draws with '' at each hole, entries...} when a correction
-- left holes.
local function draws_at_commit(K, log, replica, mass, packed, width, spares, uniforms, present)
  -- the draws as sent (the first candidate of each), cut out alone: a draw that stands,
  -- as most do, needs none of the spares, each a string the server would make for nothing
  local sent = unpack_ids(packed, width, 1 + spares)
  if log[1] == replica[1] and log[2] == replica[2] and log[3] == replica[3] then
    return sent, {}, sent
  end
  local candidates = unpack_ids(packed, width)
  local behind = masslog_behind(K, replica[1], tonumber(replica[2]), replica[3])
  if #behind == 4 or #behind - 4 ~= tonumber(behind[3]) - tonumber(replica[2]) then
    return nil, behind  -- cannot catch up from the log, or too far behind for one reply
  end
  local entries = {}
  for i = 5, #behind do entries[#entries + 1] = behind[i] end
  local ids, holes = correct_draw(entries, mass[1], mass[2], mass[3], mass[4], replica[4],
    candidates, spares, uniforms, present)
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
  local touched = touched_masses(entries, per, alpha, eps, ref)
  if not touched then return false end
  local list, masses = touched[1], touched[2]
  local last = times[#times]
  local ids, at = {}, {}
  for k, id in ipairs(candidates) do
    if masses[id] == nil then
      ids[#ids + 1] = id
      at[#at + 1] = times[k]
    end
  end
  local j, known = 0, #ids
  for _, id in ipairs(list) do
    local m = masses[id]
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
