-- Add one fragment of stream `stream`: store its bytes once, append it to the stream's
-- pending list, drop pending fragments from the front while they are too stale or of
-- another session, and once fragments_per_chunk are pending turn them into a chunk
-- (evicting the oldest chunk beyond max_chunks). Then wake waiting fetches.
-- @include common
-- @include fragments
-- @include history
-- @keys 9
-- @retry never
-- KEYS[1] meta  KEYS[2..9] frags, finfo, refs, pending, streams, chunks, cinfo, cversions
-- ARGV[1] fragment blob  ARGV[2] model version (integer)  ARGV[3] session id
-- ARGV[4] stream id  ARGV[5] pub/sub channel told "chunk" when a chunk is stored
-- Records the rate history (_history.lua) on every call, from "chunks_added",
-- "chunks_evicted" (over max_chunks; stale and used-up chunks are not counted there) and
-- "fetched": units are chunks.
-- Returns {fragment id, index of the fragment in its stream, chunk id made (or ""),
-- chunks evicted, pending fragments dropped}.
-- Errors: RB_NOBUF (meta missing).
local F = fragment_keys(KEYS)
local per_chunk = tonumber(redis.call('HGET', F.meta, 'fragments_per_chunk'))
if not per_chunk then return fail('RB_NOBUF', 'fragment buffer meta ' .. F.meta .. ' does not exist') end
local version, session, stream = tonumber(ARGV[2]), ARGV[3], ARGV[4]
local current = tonumber(redis.call('HGET', F.meta, 'version'))
local current_session = redis.call('HGET', F.meta, 'session')
local max_staleness = tonumber(redis.call('HGET', F.meta, 'max_staleness'))

local fid = id_str(redis.call('HINCRBY', F.meta, 'last_fragment', 1))
local index = redis.call('HINCRBY', F.streams, stream, 1) - 1
redis.call('HSET', F.frags, fid, ARGV[1])
redis.call('HSET', F.finfo, fid, cjson.encode({stream, index, version, session}))
change_refs(F, {fid}, 1)  -- the pending list's reference
redis.call('HINCRBY', F.meta, 'fragments_added', 1)

local pending = {}
local stored = redis.call('HGET', F.pending, stream)
if stored then pending = cjson.decode(stored) end
pending[#pending + 1] = fid
-- drop from the front while too stale or of another session (MineStudio's add_fragment)
local first = 1
while first <= #pending do
  local info = cjson.decode(redis.call('HGET', F.finfo, pending[first]))
  if current - info[3] <= max_staleness and info[4] == current_session then break end
  metric_update(F, 'reuse', 0)
  change_refs(F, {pending[first]}, -1)
  first = first + 1
end
local dropped = first - 1
redis.call('HINCRBY', F.meta, 'fragments_discarded', dropped)
local kept = {}
for i = first, #pending do kept[#kept + 1] = pending[i] end

local cid, evicted = '', 0
if #kept == 0 then
  redis.call('HDEL', F.pending, stream)
elseif #kept < per_chunk then
  redis.call('HSET', F.pending, stream, cjson.encode(kept))
else
  redis.call('HDEL', F.pending, stream)
  local head = cjson.decode(redis.call('HGET', F.finfo, kept[1]))
  local indices = {}
  for i, id in ipairs(kept) do indices[i] = cjson.decode(redis.call('HGET', F.finfo, id))[2] end
  local max_chunks = tonumber(redis.call('HGET', F.meta, 'max_chunks'))
  while redis.call('ZCARD', F.chunks) >= max_chunks do
    local oldest = redis.call('ZRANGE', F.chunks, 0, 0)[1]
    local info = cjson.decode(redis.call('HGET', F.cinfo, oldest))
    metric_update(F, 'reuse', info.uses)
    drop_chunk(F, oldest, info)
    evicted = evicted + 1
  end
  cid = id_str(redis.call('HINCRBY', F.meta, 'last_chunk', 1))
  change_refs(F, kept, 1)   -- the chunk's references
  change_refs(F, kept, -1)  -- the pending list's, now gone
  redis.call('HSET', F.cinfo, cid, cjson.encode({
    stream = stream, version = head[3], session = head[4], uses = 0,
    fragments = kept, indices = indices}))
  redis.call('ZADD', F.chunks, tonumber(cid), cid)
  redis.call('ZADD', F.cversions, head[3], cid)
  redis.call('HINCRBY', F.meta, 'chunks_added', 1)
  redis.call('HINCRBY', F.meta, 'chunks_evicted', evicted)
  redis.call('PUBLISH', ARGV[5], 'chunk')
end
record_history(F.meta, {'chunks_added', 'chunks_evicted', 'fetched'})
return {fid, index, cid, evicted, dropped}
