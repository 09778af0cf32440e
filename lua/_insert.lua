-- Inserting a batch with eviction, a helper scripts name with "-- @include insert": the
-- body of add.lua, shared by every script that adds items (add,
-- add_diverse), so they store, evict and log the mass alike.
-- @include common
-- @include masslog
-- @include items
-- @include history
-- @include removers

-- The per-batch options of an add script's options argument: "" (none) or a JSON object.
local function batch_options(text)
  if text == '' then return {} end
  return cjson.decode(text)
end

-- Nil, or an error reply naming the first priority (text) that is NaN or not a number.
local function check_priorities(priorities)
  for i = 1, #priorities do
    local priority = to_number(priorities[i])
    if priority == nil or priority ~= priority then
      return fail('RB_INVALID', 'item ' .. (i - 1) .. ' has priority ' .. tostring(priorities[i])
        .. '; priorities must be numbers (not NaN)')
    end
  end
  return nil
end

-- The buffer's configuration {capacity, eviction, schema, masslog}, or nil and an error reply
-- (no buffer; a remover by priority without its heap: removers_ready).
local function buffer_config(K)
  local conf = redis.call('HMGET', K.meta, 'capacity', 'eviction', 'schema', 'masslog')
  if not conf[1] then
    return nil, fail('RB_NOBUF', 'buffer meta ' .. K.meta .. ' does not exist')
  end
  local unready = removers_ready(K, conf[2])
  if unready then return nil, unready end
  return conf, nil
end

-- Nil, or an error reply when the stored schema differs from schema_json (none stored: ok)
-- or, for a schema without log_rewards (whose items' log-rewards are all 0, see
-- rewards_kept), when a log-reward in priorities is not 0.
local function check_schema(conf, schema_json, priorities)
  if conf[3] and conf[3] ~= schema_json then return fail('RB_SCHEMA', conf[3]) end
  if priorities and schema_rewards(schema_json) == '0' then
    for i = 1, #priorities do
      if to_number(priorities[i]) ~= 0 then
        return fail('RB_INVALID', 'item ' .. (i - 1) .. ' has log-reward ' .. priorities[i]
          .. ' but the schema has no log_rewards field (its items\' log-rewards are 0)')
      end
    end
  end
  return nil
end

-- Reserve n ids for a batch (HINCRBY last_id), after its PER priorities (if any) have
-- been checked and admit_batch has admitted it. Returns first_id, or nil and the reason
-- admit_batch refused it (then only its counter is written).
local function reserve_ids(K, n, options)
  per_batch_priorities(K, n, options)  -- raises on bad PER priorities, before any write
  local refused = admit_batch(K, n, options)  -- stale or another session: counted, not stored
  if refused then return nil, refused end
  return redis.call('HINCRBY', K.meta, 'last_id', n) - n + 1, nil
end

-- Store the items with ids `ids` (first_id .. first_id + n - 1, reserved by reserve_ids),
-- then evict (count - capacity) items: the oldest ("fifo": lowest ids), the lowest
-- log-reward with the oldest first among equals ("reward"; new items may go at once), or
-- as a Reverb remover chooses them, one new item at a time (lua/_removers.lua).
-- blobs nil: their blobs are in the items hash already (add_commit.lua). The first batch
-- fixes the schema. Returns {first_id, n, evicted}.
local function commit_batch(K, conf, schema_json, options, ids, first, blobs, priorities, vecs)
  local meta = K.meta
  local capacity = tonumber(conf[1])
  local n = #ids
  if not conf[3] then
    local kind = cjson.decode(schema_json)['kind']
    redis.call('HSET', meta, 'schema', schema_json, 'kind', kind, 'rewards',
      schema_rewards(schema_json))
  end
  local scores = store_items(K, ids, blobs, priorities, first, vecs, options)
  redis.call('HINCRBY', meta, 'inserted', n)

  local victims, before = {}, nil
  local excess = redis.call('ZCARD', K.order) - capacity
  if excess > 0 then
    local source = K.order
    if conf[2] == 'reward' and rewards_kept(K) then source = K.prio end
    if per_item_remover(conf[2]) then  -- Reverb's removers (lua/_removers.lua)
      victims = remover_victims(K, conf[2], ids, excess, options)
    else
      victims = redis.call('ZRANGE', source, 0, excess - 1)
    end
    before = delete_items(K, victims)
    redis.call('HINCRBY', meta, 'evicted', #victims)
  end
  if conf[4] == '1' then  -- one entry: the new items, then the victims (maybe new ones)
    if #victims == 0 then
      masslog_append(K, ids, nil, scores)
    else
      local rows, old, new = {}, {}, {}
      for i = 1, n do
        rows[i] = ids[i]
        old[i] = 'nan'
        new[i] = scores[i] or scores[1]
      end
      for i = 1, #victims do
        rows[n + i] = victims[i]
        old[n + i] = before[i]
        new[n + i] = 'nan'
      end
      -- under PER nothing logs the scores before (delete_items returns none)
      masslog_append(K, rows, #before > 0 and old or nil, new)
    end
  end
  record_history(meta)
  return {first, n, #victims}
end

-- The ids (strings) first .. first + n - 1.
local function id_range(first, n)
  local ids = {}
  for i = 1, n do ids[i] = id_str(first + i - 1) end
  return ids
end

-- Insert blobs with their priorities (text; checked by the caller) and, when vecs is not
-- nil, their state vectors, in one script (reserve_ids, then commit_batch). `options` is
-- the decoded per-batch options object. Returns {first_id, n, evicted}, or
-- {0, 0, 0, reason} when admit_batch (in _items.lua) refuses a batch that is stale or
-- from another session.
local function insert_batch(K, conf, schema_json, options, blobs, priorities, vecs)
  local first, refused = reserve_ids(K, #blobs, options)
  if refused then return {0, 0, 0, refused} end
  return commit_batch(K, conf, schema_json, options, id_range(first, #blobs), first, blobs,
    priorities, vecs)
end

-- Delete blobs of the items hash that no item owns (not in the order zset), except those
-- of `own` (ids of the batch being committed): O(length), for add_commit.lua's rare case.
local function drop_orphans(K, own)
  local mine = {}
  for _, id in ipairs(own) do mine[id] = true end
  local fields = redis.call('HKEYS', K.items)
  local scores = zmscore_chunked(K.order, fields)
  local orphans = {}
  for i = 1, #fields do
    if not scores[i] and not mine[fields[i]] then orphans[#orphans + 1] = fields[i] end
  end
  call_chunked('HDEL', K.items, orphans)
end
