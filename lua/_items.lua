-- Adding, removing and drawing items, pasted in place of "-- @include items" (needs common
-- and tree). Every per-item structure is written here and nowhere else, so a new one (a
-- use count, a version) is kept consistent by adding it to these functions only.

-- Store new items: ids (strings), blobs and priorities (text) in batch order.
local function store_items(K, ids, blobs, priorities, first)
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
  notify_changed(K.meta)  -- wake blocked samplers (redisbuf/waiting.py)
end

-- Delete items from every per-item structure except the sum tree (see tree_update).
local function delete_items(K, ids)
  if #ids == 0 then return end
  call_chunked('HDEL', K.items, ids)
  call_chunked('ZREM', K.prio, ids)
  call_chunked('ZREM', K.order, ids)
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
-- script calls this once with everything it returns.
local function record_draws(K, ids)
  redis.call('HINCRBY', K.meta, 'sampled', #ids)
end
