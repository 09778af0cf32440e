-- Adding, removing and drawing items, a helper scripts name with "-- @include items".
-- Every per-item structure is written here and nowhere else, so a new one (a
-- use count, a version) is kept consistent by adding it to these functions only.
-- @include common
-- @include masslog

-- Data lifetime (redisbuf/sampling/lifetime.py). Per item: uses (times sampled, absent = 0),
-- versions (model version, only for items added with one); per add: times (its insertion
-- time, unix seconds, scored by its first id). Meta: max_use, max_staleness, cur_session, cur_version (configuration and
-- current state) and the counters below, so stats() needs no scan:
--   present_uses / removed_uses / removed_items: uses of items present / removed, items
--   removed (evicted, used up, stale); retired: items removed by max_use; reset_through:
--   the last id given out when a clear or a load last reset these counters;
--   stale_removed, rejected_stale, rejected_session; sampled_unique: items sampled at
--   least once (each counted at its first draw); staleness_sum / staleness_count:
--   staleness of sampled items that carry a version.

-- Why a batch may not be stored (MineStudio's rule): "session" when options.session_id
-- differs from the current session, "stale" when the current version minus
-- options.model_version exceeds max_staleness; nil when it may. A refused batch is
-- counted (rejected_session / rejected_stale) and nothing else is written. The first
-- batch with a session id while none is current makes that session current.
local function admit_batch(K, n, options)
  if not options then return nil end
  local session, version = options.session_id, options.model_version
  if session == nil and version == nil then return nil end
  local conf = redis.call('HMGET', K.meta, 'cur_session', 'cur_version', 'max_staleness')
  if session ~= nil and conf[1] and conf[1] ~= session then
    redis.call('HINCRBY', K.meta, 'rejected_session', n)
    return 'session'
  end
  if version ~= nil and conf[2] and conf[3]
      and tonumber(conf[2]) - version > tonumber(conf[3]) then
    redis.call('HINCRBY', K.meta, 'rejected_stale', n)
    return 'stale'
  end
  if session ~= nil and not conf[1] then redis.call('HSET', K.meta, 'cur_session', session) end
  return nil
end

-- Prioritized experience replay (PER) keeps no priority per item on the server: the
-- priorities are the newest snapshot and the mass log after it (lua/_masslog.lua, meta
-- log_truth = 1), which every change appends to and the samplers' replicas apply. Meta
-- keeps per_max, the highest priority ever set since PER was turned on or the buffer
-- cleared (a running max, as DI-engine and TorchRL keep: new items get it without a
-- scan).
local function per_enabled(K)
  return redis.call('HGET', K.meta, 'mass') == 'per'
end

-- Raise meta per_max to `value` (a number) when it is higher.
local function per_raise_max(K, value)
  local top = tonumber(redis.call('HGET', K.meta, 'per_max'))
  if top == nil or value > top then redis.call('HSET', K.meta, 'per_max', fmt(value)) end
end

-- Keep the per_heap zset (PER priorities in order, for heap selectors) in step with the
-- priorities: pairs {id, priority text, ...} set, or ids removed. Only once a heap selector
-- by priority asked for it (lua/heap_build.lua: meta per_heap = b while it builds the
-- heap, changes kept from its start; 1 once built): other buffers pay no O(log n) per
-- change.
local function heap_kept(K)
  local state = redis.call('HGET', K.meta, 'per_heap')
  return state == '1' or state == 'b'
end

local function per_heap_set(K, pairs_)
  if not heap_kept(K) then return end
  local scored = {}
  for i = 1, #pairs_, 2 do
    scored[i] = pairs_[i + 1]
    scored[i + 1] = pairs_[i]
  end
  call_chunked('ZADD', K.per_heap, scored)
end

local function per_heap_remove(K, ids)
  if not heap_kept(K) then return end
  call_chunked('ZREM', K.per_heap, ids)
end

-- A PER priority given as text: a finite number >= 0, or nil.
local function per_parse(text)
  local value = tonumber(text)
  if value == nil or value ~= value or value < 0 or value == math.huge then return nil end
  return value
end

-- The PER priorities of n new items as {numbers, texts}, or nil when PER is off:
-- options.per_priorities (text) when given, else max(per_initial, per_max) for all (texts
-- then holds that one value). Raises RB_INVALID (a priority that is not a finite number
-- >= 0) or RB_CONFIG (priorities without PER); insert_batch calls it before its first
-- write for that.
local function per_batch_priorities(K, n, options)
  local given = options and options.per_priorities
  if not per_enabled(K) then
    if given then
      error('RB_CONFIG priorities= needs prioritized experience replay (PERSampler) on '
        .. K.meta)
    end
    return nil
  end
  local out = {}
  if given then
    if #given ~= n then error('RB_INVALID ' .. #given .. ' priorities for ' .. n .. ' items') end
    local texts = {}
    for i = 1, n do
      out[i] = per_parse(given[i])
      if out[i] == nil then
        error('RB_INVALID item ' .. (i - 1) .. ' has PER priority ' .. tostring(given[i])
          .. '; priorities must be finite and >= 0')
      end
      texts[i] = fmt(out[i])
    end
    return {out, texts}
  end
  local conf = redis.call('HMGET', K.meta, 'per_initial', 'per_max')
  local value = tonumber(conf[1]) or 1
  local top = tonumber(conf[2])
  if top and top > value then value = top end
  for i = 1, n do out[i] = value end
  return {out, {fmt(value)}}
end

-- Store new items: ids (strings; first .. first + #ids - 1), blobs and priorities (text)
-- in batch order, when vecs is not nil each item's state vector (text, see
-- lua/add_diverse.lua), and when PER is on their PER priorities (options.per_priorities,
-- else per_batch_priorities' default). blobs nil: the blobs are in the items hash already,
-- written by a native HSET in the caller's transaction (lua/add_commit.lua), which spares
-- carrying them through Lua. Returns the new items' scores for the mass log (text: their
-- PER priorities under PER, one value when all share it, else their log-rewards).
local function store_items(K, ids, blobs, priorities, first, vecs, options)
  local per_values = per_batch_priorities(K, #ids, options)
  local prio_pairs, order_pairs = {}, {}
  for i = 1, #ids do
    prio_pairs[2 * i - 1] = priorities[i]
    prio_pairs[2 * i] = ids[i]
    order_pairs[2 * i - 1] = first + i - 1
    order_pairs[2 * i] = ids[i]
  end
  if blobs then
    local item_pairs = {}
    for i = 1, #ids do
      item_pairs[2 * i - 1] = ids[i]
      item_pairs[2 * i] = blobs[i]
    end
    call_chunked('HSET', K.items, item_pairs)
  end
  if rewards_kept(K) then call_chunked('ZADD', K.prio, prio_pairs) end
  call_chunked('ZADD', K.order, order_pairs)
  -- One insertion-time entry per add, not per item (an add's items share its time and
  -- hold contiguous ids): member "<first id>|<unix time>", scored by the first id.
  local now = redis.call('TIME')
  redis.call('ZADD', K.times, first,
    ids[1] .. '|' .. now[1] .. '.' .. string.format('%06d', now[2]))
  if options and options.model_version ~= nil then
    local version_pairs = {}
    for i = 1, #ids do
      version_pairs[2 * i - 1] = options.model_version
      version_pairs[2 * i] = ids[i]
    end
    call_chunked('ZADD', K.versions, version_pairs)
  end
  local scores = priorities
  if per_values then
    local values, texts = per_values[1], per_values[2]
    local per_pairs = {}
    for i = 1, #ids do
      per_pairs[2 * i - 1] = ids[i]
      per_pairs[2 * i] = texts[i] or texts[1]
    end
    per_heap_set(K, per_pairs)
    local top = values[1] or 0
    for i = 2, #values do if values[i] > top then top = values[i] end end
    -- options.per_keep_max: given priorities leave the running max as it is (DI-engine's
    -- max priority counts updates only)
    if not (options and options.per_keep_max) then per_raise_max(K, top) end
    scores = texts
  end
  if vecs then
    local vec_pairs = {}
    for i = 1, #ids do
      vec_pairs[2 * i - 1] = ids[i]
      vec_pairs[2 * i] = vecs[i]
    end
    call_chunked('HSET', K.vecs, vec_pairs)
  end
  notify_changed(K.meta)  -- wake blocked samplers (redisbuf/sampling/waiting.py)
  return scores
end

-- The scores the mass log holds for ids (text; "nan" for an id without one): their
-- log-rewards; nil under PER, whose entries log no score before a change.
local function logged_scores(K, ids)
  local found
  if per_enabled(K) then
    return nil
  elseif rewards_kept(K) then
    found = zmscore_chunked(K.prio, ids)
  else
    found = zmscore_chunked(K.order, ids)
    for i = 1, #ids do if found[i] then found[i] = '0' end end
  end
  for i = 1, #ids do found[i] = found[i] or 'nan' end
  return found
end

-- Drop the insertion-time entries of adds older than the oldest item left (the order
-- zset scores items by id): the entry covering it, and every later one, stay.
local function trim_times(K)
  local oldest = redis.call('ZRANGE', K.order, 0, 0, 'WITHSCORES')
  if #oldest == 0 then
    redis.call('UNLINK', K.times)
    return
  end
  local cover = redis.call('ZREVRANGEBYSCORE', K.times, oldest[2], '-inf', 'WITHSCORES',
    'LIMIT', 0, 1)
  if #cover > 0 then redis.call('ZREMRANGEBYSCORE', K.times, '-inf', '(' .. cover[2]) end
end

-- Delete items from every per-item structure. Returns their scores before (see
-- logged_scores; {} under PER or while prioritized sampling is off), for the mass log
-- entry (the caller's).
local function delete_items(K, ids)
  if #ids == 0 then return {} end
  local before
  if masslog_on(K) then before = logged_scores(K, ids) end
  local uses, used = hmget_chunked(K.uses, ids), 0
  for i = 1, #uses do
    if uses[i] then used = used + tonumber(uses[i]) end
  end
  redis.call('HINCRBY', K.meta, 'removed_items', #ids)
  if used > 0 then
    redis.call('HINCRBY', K.meta, 'removed_uses', used)
    redis.call('HINCRBY', K.meta, 'present_uses', -used)
  end
  call_chunked('HDEL', K.uses, ids)
  call_chunked('ZREM', K.versions, ids)
  if per_enabled(K) then per_heap_remove(K, ids) end
  call_chunked('HDEL', K.items, ids)
  call_chunked('ZREM', K.prio, ids)
  call_chunked('ZREM', K.order, ids)
  call_chunked('HDEL', K.vecs, ids)
  trim_times(K)
  return before or {}
end

-- Delete items everywhere, and log their removal for prioritized samplers' replicas.
local function remove_items(K, ids)
  if #ids == 0 then return end
  local before = delete_items(K, ids)
  masslog_append(K, ids, before, nil)
end

-- Set the PER priorities of ids known to be stored (the caller checked each, in the same
-- script: lua/replace.lua). priorities: numbers; texts: how each is logged (plain
-- decimals); last: nil when no id repeats, else each id's last position (its priority
-- wins). Logs one C entry (the ids present, with their priorities now), raises the running
-- max and keeps the priority heap, as lua/update_priority.lua's U entry would, whose
-- presence check the replicas then need not make.
local function set_priorities(K, ids, priorities, texts, last)
  if last then  -- keep each id's last occurrence
    local kept_ids, kept_values, kept_texts = {}, {}, {}
    for i = 1, #ids do
      if last[ids[i]] == i then
        kept_ids[#kept_ids + 1] = ids[i]
        kept_values[#kept_values + 1] = priorities[i]
        kept_texts[#kept_texts + 1] = texts[i]
      end
    end
    ids, priorities, texts = kept_ids, kept_values, kept_texts
  end
  if #ids == 0 then return 0 end
  local pairs_, top = {}, 0
  for i = 1, #ids do
    pairs_[2 * i - 1] = ids[i]
    pairs_[2 * i] = texts[i]
    if priorities[i] > top then top = priorities[i] end
  end
  per_heap_set(K, pairs_)
  per_raise_max(K, top)
  masslog_append(K, ids, nil, texts)
  return #ids
end

-- Bookkeeping for items a sampling script has chosen (ids may repeat): every sampling
-- script calls this once with everything it returns, AFTER reading their blobs: an item
-- drawn for the max_use-th time is removed here (DI-engine's max_use), whichever process
-- draws it. Each draw adds one use (an item drawn twice in a batch counts two), and the
-- staleness (current version - item's version) of each versioned draw is summed. It
-- writes nothing in the read-only variant (RB_NO_WRITES, see redisbuf/store/scripts.py: a full
-- server or a replica still samples, without max_use), nor once the buffer is dropped (a
-- counter must not recreate its meta). Returns each drawn id's uses after the call (-1
-- for an item it removed) and the buffer's max_use (nil: none); nil when it wrote nothing.
local function record_draws(K, ids)
  if RB_NO_WRITES or redis.call('EXISTS', K.meta) == 0 then return end
  redis.call('HINCRBY', K.meta, 'sampled', #ids)
  if #ids == 0 then return {}, nil end
  local conf = redis.call('HMGET', K.meta, 'max_use', 'cur_version')
  local max_use, counts, distinct = tonumber(conf[1]), {}, {}
  for i = 1, #ids do
    local id = ids[i]
    if id then
      if counts[id] == nil then
        counts[id] = 0
        distinct[#distinct + 1] = id
      end
      counts[id] = counts[id] + 1
    end
  end
  -- one HMGET and one HSET rather than an HINCRBY per item: a third of the server time
  local before, used_up, total, use_pairs = hmget_chunked(K.uses, distinct), {}, 0, {}
  local after = {}
  local first_time = 0  -- items sampled for the first time (Reverb's num_unique_samples)
  for j, id in ipairs(distinct) do
    if not before[j] then first_time = first_time + 1 end
    total = total + counts[id]
    local uses = (tonumber(before[j]) or 0) + counts[id]
    use_pairs[2 * j - 1] = id
    use_pairs[2 * j] = uses
    after[id] = uses
    if max_use and uses >= max_use then
      used_up[#used_up + 1] = id
      after[id] = -1
    end
  end
  call_chunked('HSET', K.uses, use_pairs)
  redis.call('HINCRBY', K.meta, 'present_uses', total)
  if first_time > 0 then redis.call('HINCRBY', K.meta, 'sampled_unique', first_time) end
  if conf[2] then
    local current, sum, count = tonumber(conf[2]), 0, 0
    local versions = zmscore_chunked(K.versions, distinct)
    for j, id in ipairs(distinct) do
      if versions[j] then
        sum = sum + counts[id] * (current - tonumber(versions[j]))
        count = count + counts[id]
      end
    end
    if count > 0 then
      redis.call('HINCRBYFLOAT', K.meta, 'staleness_sum', sum)
      redis.call('HINCRBY', K.meta, 'staleness_count', count)
    end
  end
  if #used_up > 0 then
    remove_items(K, used_up)
    redis.call('HINCRBY', K.meta, 'retired', #used_up)
  end
  return after, max_use
end

-- Take back draws that were not returned (their items vanished before the blobs were
-- read); the same guards as record_draws. Each draw's use comes off where it is counted
-- now: the item's uses and present_uses while it is stored; removed_uses once it was
-- removed since (its removal moved the use there: delete_items); nowhere, nor from
-- sampled, for an id at or below meta reset_through (a clear or a load since reset the
-- counters; ids are never reused).
local function unrecord_draws(K, ids)
  if RB_NO_WRITES or redis.call('EXISTS', K.meta) == 0 then return end
  local reset = tonumber(redis.call('HGET', K.meta, 'reset_through')) or -1
  local present, removed, unsampled = 0, 0, 0
  for i = 1, #ids do
    if redis.call('HEXISTS', K.items, ids[i]) == 1 then
      local left = redis.call('HINCRBY', K.uses, ids[i], -1)
      -- back to never sampled: its first draw is no longer counted in sampled_unique
      if left == 0 then unsampled = unsampled + 1 end
      if left <= 0 then redis.call('HDEL', K.uses, ids[i]) end
      present = present + 1
    elseif tonumber(ids[i]) > reset then
      removed = removed + 1
    end
  end
  if present + removed > 0 then redis.call('HINCRBY', K.meta, 'sampled', -(present + removed)) end
  if present > 0 then redis.call('HINCRBY', K.meta, 'present_uses', -present) end
  if removed > 0 then redis.call('HINCRBY', K.meta, 'removed_uses', -removed) end
  if unsampled > 0 then redis.call('HINCRBY', K.meta, 'sampled_unique', -unsampled) end
end
