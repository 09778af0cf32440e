-- Commit a prioritized draw made by a sampling process from its replica of the buffer's
-- scores (redisbuf/sampling/replica.py): check that the replica was current, or correct the
-- draw to the current law, record the draws and optionally return the blobs, in one
-- atomic call. The same script serves softmax of log-rewards and PER.
-- @include common
-- @include masslog
-- @include items
-- @include correct
-- @keys 13
-- @retry draw
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order
-- ARGV[1] "softmax" or "per" (the rule the replica drew by)  ARGV[2] its log_epoch
-- ARGV[3] its log_version  ARGV[4] its log_stamp (the stamp of the entry at its version)
-- ARGV[5] mode: "exact": the draw stands only if the log is at the replica's version and
--   stamp (then it follows every change made before this call, whatever it drew);
--   "correct" (draws with replacement): as "exact" when nothing changed since; otherwise
--   the draw is corrected here to the current law (see draws_at_commit, correct_draw)
--   and stands; "successive" (draws without replacement): as "exact" when nothing
--   changed since; otherwise corrected to the current law as a race (see
--   successive_at_commit, correct_successive)
-- ARGV[6] "1" = also return blobs
-- ARGV[7] the drawn ids, packed (see unpack_ids; may repeat)  ARGV[8] their width
-- "correct": also ARGV[9] S, the spare draws per draw  ARGV[10] two uniforms per draw,
--   packed 6 bytes each (see uniform_at)  ARGV[11] the replica's total mass  ARGV[12] its
--   softmax reference (masses exp(log_reward - ref); "0" under PER); ARGV[7] then holds
--   the candidates: 1 + S per draw (the draw, then S more draws of the replica), draw
--   after draw
-- "successive": also ARGV[9] n, the draws  ARGV[10] uniforms for the touched items' times,
--   packed as ARGV[10] of "correct"  ARGV[11] the candidates' arrival times, ascending,
--   comma-separated  ARGV[12] the softmax reference; ARGV[7] then holds the candidates:
--   the replica's first arrivals (n or more), in order
-- Returns {1, length, 0, 0, ids, epoch, version, stamp, count,
-- blob_1..blob_count, entry_1..} when the draw stands: ids "" when it stands as sent,
-- else the corrected draw (ids comma-separated), with the log entries after the
-- replica's version (its catch-up) after the blobs (count of them: 0 unless asked, or
-- for a corrected draw not asked, n, nil but where the draw moved from its candidate);
-- in place of the two 0s (once the draws are recorded; the read-only variant keeps them):
-- each draw's item's uses after the call (-1: the call removed it, at max_use),
-- comma-separated, and "LENGTH:MAX_USE", the buffer's length after the call and its
-- max_use ("" for none).
-- {3, epoch, version, stamp, ids,
-- entries...} when a corrected draw has holes: ids as above with '' at each position
-- whose candidates ran out (or whose touched item drawn was not stored); nothing is
-- recorded, and the caller, caught up by the entries, fills each hole with a fresh draw
-- of its replica and commits the whole draw again. "successive": {3, epoch, version,
-- stamp, "id:time,..." (every arrival known), entries...} when too few arrivals are known
-- (see successive_at_commit); nothing is recorded, and the caller, caught up, runs the
-- race on and commits again. Else the replica's catch-up (masslog_behind): {0, epoch, version,
-- stamp, entries...}. The work is bounded: a
-- correction reads at most the entries one catch-up reply carries (masslog_behind).
-- Errors: RB_NOLOG (prioritized sampling, or PER for "per", is not on), RB_CONFIG (the
-- buffer samples by the other rule), RB_LIMIT (more than RB_MAX_ITEMS draws, or for
-- "successive" more than twice as many candidates), RB_INVALID ("successive": not one
-- time per candidate, or fewer candidates than draws).

local K = buffer_keys(KEYS)
local draws = #ARGV[7] / tonumber(ARGV[8])
local candidates = draws
if ARGV[5] == 'correct' then draws = draws / (1 + tonumber(ARGV[9])) end
if ARGV[5] == 'successive' then draws = tonumber(ARGV[9]) end
if draws > RB_MAX_ITEMS then
  return fail('RB_LIMIT', 'one command commits at most ' .. RB_MAX_ITEMS .. ' draws, got '
    .. draws .. ' (redisbuf/store/bounds.py)')
end
if ARGV[5] == 'successive' then
  if candidates > 2 * RB_MAX_ITEMS then
    return fail('RB_LIMIT', 'a successive draw sends at most ' .. 2 * RB_MAX_ITEMS
      .. ' candidates, got ' .. candidates .. ' (redisbuf/store/bounds.py)')
  end
  local _, commas = string.gsub(ARGV[11], ',', '')
  if draws > candidates or commas + 1 ~= candidates then
    return fail('RB_INVALID', 'a successive draw needs one arrival time per candidate and'
      .. ' at least as many candidates as draws')
  end
end
local conf = redis.call('HMGET', K.meta, 'masslog', 'mass', 'log_epoch', 'log_version',
  'log_stamp', 'per_alpha', 'per_eps')
local per = conf[2] == 'per'
if conf[1] ~= '1' or (ARGV[1] == 'per' and not per) then
  if ARGV[1] == 'per' then return fail('RB_NOLOG', 'prioritized experience replay is not enabled') end
  return fail('RB_NOLOG', 'prioritized sampling is not enabled')
end
if ARGV[1] ~= 'per' and per then
  return fail('RB_CONFIG', 'buffer ' .. K.meta .. ' samples by PER priorities'
    .. ' (PERSampler), not by log-rewards')
end
local entries, ids, primaries = {}, {}, {}
if ARGV[5] == 'correct' then
  local stand
  ids, stand, primaries = draws_at_commit(K, {conf[3], conf[4], conf[5]},
    {ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[11])},
    {per, tonumber(conf[6]) or 1, tonumber(conf[7]) or 0, tonumber(ARGV[12])},
    ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9]), ARGV[10],
    function(id) return redis.call('HEXISTS', K.items, id) == 1 end)
  if not ids then return stand end
  entries = stand
elseif ARGV[5] == 'successive' then
  local stand
  ids, stand, primaries = successive_at_commit(K, {conf[3], conf[4], conf[5]},
    {ARGV[2], ARGV[3], ARGV[4]},
    {per, tonumber(conf[6]) or 1, tonumber(conf[7]) or 0, tonumber(ARGV[12])},
    ARGV[7], tonumber(ARGV[8]), draws, ARGV[11], ARGV[10])
  if not ids then return stand end
  entries = stand
else
  if not (conf[3] == ARGV[2] and conf[4] == ARGV[3] and conf[5] == ARGV[4]) then
    return masslog_behind(K, ARGV[2], tonumber(ARGV[3]), ARGV[4])
  end
  ids = unpack_ids(ARGV[7], tonumber(ARGV[8]))
end
local corrected = ''
if #entries > 0 then corrected = table.concat(ids, ',') end
local out = {1, redis.call('ZCARD', K.order), '0', '0', corrected, conf[3] or '',
  conf[4] or '0', conf[5] or '', 0}
if ARGV[6] == '1' then
  local blobs = hmget_chunked(K.items, ids)
  for i = 1, #ids do out[#out + 1] = blobs[i] end
  out[9] = #ids
elseif #entries > 0 then  -- corrected: the blobs of the draws that moved, read here (atomic)
  local moved, where = {}, {}
  for j = 1, #ids do
    if ids[j] ~= primaries[j] then
      moved[#moved + 1] = ids[j]
      where[#where + 1] = j
    end
  end
  local blobs = hmget_chunked(K.items, moved)
  for j = 1, #ids do out[9 + j] = false end
  for k = 1, #moved do out[9 + where[k]] = blobs[k] end
  out[9] = #ids
end
for i = 1, #entries do out[#out + 1] = entries[i] end
-- after reading the blobs: it may remove used-up items
local after, max_use = record_draws(K, ids)
if after then  -- what a reader would read next, here, so that it need not ask
  local uses = {}
  for i = 1, #ids do uses[i] = after[ids[i]] end
  out[3] = table.concat(uses, ',')
  out[4] = redis.call('ZCARD', K.order) .. ':' .. (max_use or '')
end
return out
