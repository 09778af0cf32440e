-- Storing a large add a slice at a time, a helper scripts name with "-- @include apply":
-- the steps that lua/add_staged.lua starts and lua/add_apply.lua goes on with.
-- @include common
-- @include masslog
-- @include items
-- @include history
-- @include insert
-- An add of more than one add's bound (RB_MAX_ADD items, RB_MAX_ADD_BYTES) is staged
-- slice by slice (lua/add_stage.lua) under keys no reader looks at, then committed
-- (lua/add_staged.lua): the commit reserves its ids, renames the staged keys to the
-- buffer's applying keys and sets meta "applying", and from then on every other script
-- on the buffer refuses with RB_APPLYING (refuse_while_applying in _common.lua) until
-- the steps have stored every slice. A step stores one staged slice as one add does
-- (commit_batch: order, priorities, eviction, the mass log), so no command does more
-- than an add; any caller that meets RB_APPLYING runs steps, so a writer that dies after
-- its commit blocks nobody; and readers see all of the add or none of it.
-- The applying keys A: A.state (hash: first, n, next, evicted, schema, options, batch,
-- tag), A.blobs (position in the batch -> blob), A.texts (position -> log-reward,
-- "p" .. position -> PER priority, "s" .. start -> where the slice from start ends).

local function applying_keys(keys, at)
  return {state = keys[at], blobs = keys[at + 1], texts = keys[at + 2]}
end

-- Store the next staged slice; after the last, clear the flag and replace the writer's
-- remembered reply (its batch memory entry, tag A.state's "tag") by the whole add's.
-- Returns {done (1 or 0), first id, n, items evicted so far}; {1, 0, 0, 0} when nothing
-- is being applied (finished by another caller, or the buffer dropped).
local function apply_step(K, A)
  local st = redis.call('HMGET', A.state, 'first', 'n', 'next', 'evicted', 'schema',
    'options', 'batch', 'tag')
  if not st[1] then
    if redis.call('EXISTS', K.meta) == 1 then redis.call('HDEL', K.meta, 'applying') end
    return {1, 0, 0, 0}
  end
  local first, n, start = tonumber(st[1]), tonumber(st[2]), tonumber(st[3])
  local evicted = tonumber(st[4])
  local stop = tonumber(redis.call('HGET', A.texts, 's' .. start))
  local positions = {}
  for i = start, stop - 1 do positions[#positions + 1] = tostring(i) end
  local blobs = hmget_chunked(A.blobs, positions)
  local rewards = hmget_chunked(A.texts, positions)
  local options = batch_options(st[6])
  if options.per_given then
    local per_fields = {}
    for i = start, stop - 1 do per_fields[#per_fields + 1] = 'p' .. i end
    options.per_priorities = hmget_chunked(A.texts, per_fields)
  end
  local conf = redis.call('HMGET', K.meta, 'capacity', 'eviction', 'schema', 'masslog')
  local stored = commit_batch(K, conf, st[5], options, id_range(first + start, stop - start),
    first + start, blobs, rewards, nil)
  evicted = evicted + stored[3]
  if stop < n then
    call_chunked('HDEL', A.blobs, positions)  -- frees the slice's copy as it goes
    redis.call('HSET', A.state, 'next', stop, 'evicted', evicted)
    return {0, first, n, evicted}
  end
  redis.call('UNLINK', A.state, A.blobs, A.texts)
  redis.call('HDEL', K.meta, 'applying')
  local whole = {first, n, evicted}
  redis.call('HDEL', K.batches_old, st[7])  -- (an older generation's entry, if any)
  redis.call('HSET', K.batches, st[7], st[8] .. cjson.encode(whole))
  return {1, first, n, evicted}
end
