-- Adding, removing and drawing items, pasted in place of "-- @include items" (needs common
-- and tree). Every per-item structure is written here and nowhere else, so a new one (a
-- use count, a version) is kept consistent by adding it to these functions only.

-- Store new items: ids (strings), blobs and priorities (text) in batch order, and when
-- vecs is not nil each item's state vector (text, see lua/add_diverse.lua).
local function store_items(K, ids, blobs, priorities, first, vecs)
  local item_pairs, prio_pairs, order_pairs = {}, {}, {}
  for i = 1, #ids do
    item_pairs[2 * i - 1] = ids[i]
    item_pairs[2 * i] = blobs[i]
    prio_pairs[2 * i - 1] = priorities[i]
    prio_pairs[2 * i] = ids[i]
    order_pairs[2 * i - 1] = first + i - 1
    order_pairs[2 * i] = ids[i]
  end
  call_chunked('HSET', K.items, item_pairs)
  call_chunked('ZADD', K.prio, prio_pairs)
  call_chunked('ZADD', K.order, order_pairs)
  if vecs then
    local vec_pairs = {}
    for i = 1, #ids do
      vec_pairs[2 * i - 1] = ids[i]
      vec_pairs[2 * i] = vecs[i]
    end
    call_chunked('HSET', K.vecs, vec_pairs)
  end
end

-- Delete items from every per-item structure except the sum tree (see tree_update).
local function delete_items(K, ids)
  if #ids == 0 then return end
  call_chunked('HDEL', K.items, ids)
  call_chunked('ZREM', K.prio, ids)
  call_chunked('ZREM', K.order, ids)
  call_chunked('HDEL', K.vecs, ids)
end

-- Delete items everywhere, the sum tree included (when prioritized sampling is on).
local function remove_items(K, ids)
  if #ids == 0 then return end
  delete_items(K, ids)
  if redis.call('HGET', K.meta, 'tree') == '1' then
    tree_update(K, tonumber(redis.call('HGET', K.meta, 'capacity')), ids, {}, {})
  end
end

-- Bookkeeping for items a sampling script has chosen (ids may repeat): every sampling
-- script calls this once with everything it returns. It writes nothing in the read-only
-- variant (RB_NO_WRITES, see redisbuf/scripts.py: a full server or a replica still
-- samples), nor once the buffer is dropped (a counter must not recreate its meta).
local function record_draws(K, ids)
  if RB_NO_WRITES or redis.call('EXISTS', K.meta) == 0 then return end
  redis.call('HINCRBY', K.meta, 'sampled', #ids)
end

-- Take back draws that were not returned (their items vanished before the blobs were
-- read); the same guards as record_draws.
local function unrecord_draws(K, ids)
  if RB_NO_WRITES or redis.call('EXISTS', K.meta) == 0 then return end
  redis.call('HINCRBY', K.meta, 'sampled', -#ids)
end
