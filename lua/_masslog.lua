-- The mass log, pasted in place of "-- @include masslog" (needs common).
-- Prioritized sampling (softmax of log-rewards, or PER) draws in the sampling processes,
-- each from its own replica of the items' scores (redisbuf/sampling/replica.py). The server keeps
-- the truth (the prio zset for softmax, the per zset for PER) and, while prioritized
-- sampling is on (meta tree = 1), this log of every change to it, appended by the same
-- script that makes the change, so a replica catches up by reading the entries after the
-- version it has. Writing a change costs one RPUSH whatever the buffer's size.
--
-- The masslog list holds the newest entries, one a change:
--   "S|k|ids|scores"  k items (new or re-scored) now have these scores: ids 12 characters
--                     each, back to back; scores as text, comma-separated (log-rewards
--                     under softmax, PER priorities under PER)
--   "R|k|ids|"        k items were removed (unknown ids are ignored)
--   "X|0||"           everything changed (enabled, cleared, restored): read it all again
-- Meta: log_epoch (changes with every X, so a replica never mistakes a new log for its
-- old one), log_version (entries ever appended since that epoch; the last entry's
-- version), log_first (the version of the list's first entry), log_ids (ids named by the
-- entries in the list). The oldest entries are dropped while the list names more than
-- max(MASSLOG_MIN_IDS, capacity / 4) ids: a replica further behind reads everything again.
local MASSLOG_MIN_IDS = 10000

local function masslog_on(K)
  return redis.call('HGET', K.meta, 'tree') == '1'
end

-- Delete what an earlier version's server-side sum tree left (keys tree, tree:ids,
-- tree:slots, tree:free and its meta fields). UNLINK frees large values in the background.
local function drop_legacy_tree(K)
  redis.call('UNLINK', K.tree, K.tree_ids, K.tree_slots, K.tree_free)
  redis.call('HDEL', K.meta, 'tree_depth', 'tree_ref', 'tree_next_slot', 'tree_layout')
end

-- Start a new log (a new epoch) with one X entry: every replica reads everything again.
local function masslog_reset(K)
  local now = redis.call('TIME')
  drop_legacy_tree(K)
  redis.call('DEL', K.masslog)
  redis.call('RPUSH', K.masslog, 'X|0||')
  redis.call('HSET', K.meta, 'log_epoch', now[1] .. string.format('%06d', now[2]),
    'log_version', 1, 'log_first', 1, 'log_ids', 0)
end

-- Append one entry: kind 'S' (ids and their scores as text) or 'R' (ids). No-op without
-- ids or while prioritized sampling is off.
local function masslog_append(K, kind, ids, scores)
  if #ids == 0 or not masslog_on(K) then return end
  local entry = kind .. '|' .. #ids .. '|' .. table.concat(ids) .. '|'
  if scores then entry = entry .. table.concat(scores, ',') end
  local conf = redis.call('HMGET', K.meta, 'log_version', 'log_first', 'log_ids', 'capacity')
  if not conf[1] then  -- turned on by an earlier version: start the log now
    masslog_reset(K)
    conf = redis.call('HMGET', K.meta, 'log_version', 'log_first', 'log_ids', 'capacity')
  end
  local version, first, held = tonumber(conf[1]) + 1, tonumber(conf[2]), tonumber(conf[3]) + #ids
  local length = redis.call('RPUSH', K.masslog, entry)
  local limit = math.max(MASSLOG_MIN_IDS, math.floor((tonumber(conf[4]) or 0) / 4))
  while held > limit and length > 1 do
    local oldest = redis.call('LPOP', K.masslog)
    local bar = string.find(oldest, '|', 3, true)
    held = held - tonumber(string.sub(oldest, 3, bar - 1))
    first = first + 1
    length = length - 1
  end
  redis.call('HSET', K.meta, 'log_version', version, 'log_first', first, 'log_ids', held)
end

-- The reply a sampling script gives a replica that is not current: {0, epoch, version,
-- first, entries after `have` (the replica's version) if the list still holds them}.
-- A replica of another epoch, or too far behind, gets no entries and reads everything.
local function masslog_behind(K, epoch, have)
  local conf = redis.call('HMGET', K.meta, 'log_epoch', 'log_version', 'log_first')
  local out = {0, conf[1] or '', conf[2] or '0', conf[3] or '0'}
  local version, first = tonumber(conf[2]) or 0, tonumber(conf[3]) or 0
  if conf[1] == epoch and have >= first - 1 and have < version then
    local entries = redis.call('LRANGE', K.masslog, have + 1 - first, -1)
    for i = 1, #entries do out[4 + i] = entries[i] end
  end
  return out
end

-- Items of log-reward +inf: the softmax is undefined while any is present.
local function infinite_count(prio_key)
  return redis.call('ZCOUNT', prio_key, '+inf', '+inf')
end
