-- Fragment-buffer helpers, a helper scripts name with "-- @include fragments".
-- Not an operation of its own. KEYS of every fragment script, in FragmentKeys.all_keys()
-- order: meta, frags, finfo, refs, pending, streams, chunks, cinfo, cversions.
-- @include common

local function fragment_keys(keys)
  return {
    meta = keys[1], frags = keys[2], finfo = keys[3], refs = keys[4], pending = keys[5],
    streams = keys[6], chunks = keys[7], cinfo = keys[8], cversions = keys[9],
  }
end

-- Add `delta` to the reference count of each fragment; a fragment no longer referenced
-- (by a stream's pending list or by a chunk) loses its bytes and metadata.
local function change_refs(F, ids, delta)
  for _, id in ipairs(ids) do
    if redis.call('HINCRBY', F.refs, id, delta) <= 0 then
      redis.call('HDEL', F.refs, id)
      redis.call('HDEL', F.frags, id)
      redis.call('HDEL', F.finfo, id)
    end
  end
end

-- MineStudio's MeanMetric updates: value weighted by fragments_per_chunk.
local function metric_update(F, name, value)
  local weight = tonumber(redis.call('HGET', F.meta, 'fragments_per_chunk'))
  redis.call('HINCRBYFLOAT', F.meta, name .. '_sum', value * weight)
  redis.call('HINCRBY', F.meta, name .. '_weight', weight)
end

-- Remove chunk `cid` (its info decoded as `info`), releasing its fragments.
local function drop_chunk(F, cid, info)
  redis.call('ZREM', F.chunks, cid)
  redis.call('ZREM', F.cversions, cid)
  redis.call('HDEL', F.cinfo, cid)
  change_refs(F, info.fragments, -1)
end

-- Drop, counting their reuse, every chunk older than the current version allows, and
-- every chunk when the stored session is not the current one. Returns how many.
local function drop_stale_chunks(F, all_sessions)
  local version = tonumber(redis.call('HGET', F.meta, 'version'))
  local limit = version - tonumber(redis.call('HGET', F.meta, 'max_staleness'))
  local stale
  if all_sessions then
    stale = redis.call('ZRANGE', F.chunks, 0, -1)
  else
    stale = redis.call('ZRANGEBYSCORE', F.cversions, '-inf', '(' .. limit)
  end
  for _, cid in ipairs(stale) do
    local info = cjson.decode(redis.call('HGET', F.cinfo, cid))
    metric_update(F, 'reuse', info.uses)
    drop_chunk(F, cid, info)
  end
  redis.call('HINCRBY', F.meta, 'chunks_discarded', #stale)
  return #stale
end
