-- Draw n distinct chunks uniformly, count one use of each, and return their fragments;
-- a chunk reaching max_reuse is dropped (after its bytes are read) and its reuse and
-- staleness go into the metrics. Stale chunks are dropped first (discarded on read).
-- @include common
-- @include fragments
-- @keys 9
-- @retry never
-- KEYS[1] meta  KEYS[2..9] frags, finfo, refs, pending, streams, chunks, cinfo, cversions
-- ARGV[1] n  ARGV[2] n uniforms in [0, 1), packed 6 bytes each (see uniform_at)
-- Returns {chunks stored} when fewer than n chunks are stored (nothing changes then but
-- the stale drop), else {n, entry_1..entry_n}, entry = {chunk id, chunk info JSON with
-- the use just counted, current model version, fragment blobs...}.
-- Errors: RB_NOBUF (meta missing), RB_INVALID, RB_LIMIT (n above RB_MAX_ITEMS).
local F = fragment_keys(KEYS)
local n = tonumber(ARGV[1])
if n == nil or n > RB_MAX_ITEMS then  -- redisbuf/store/bounds.py
  return fail('RB_LIMIT', 'one command fetches at most ' .. RB_MAX_ITEMS .. ' chunks, asked '
    .. tostring(ARGV[1]))
end
if not redis.call('HGET', F.meta, 'version') then
  return fail('RB_NOBUF', 'fragment buffer meta ' .. F.meta .. ' does not exist')
end
if #ARGV[2] ~= 6 * n then return fail('RB_INVALID', 'expected ' .. n .. ' packed uniforms') end
drop_stale_chunks(F, false)
local count = redis.call('ZCARD', F.chunks)
if count < n or n < 1 then return {count} end
local current = tonumber(redis.call('HGET', F.meta, 'version'))
local max_reuse = tonumber(redis.call('HGET', F.meta, 'max_reuse'))
local ranks, swapped = {}, {}
for i = 1, n do
  local j = (i - 1) + math.floor(uniform_at(ARGV[2], i) * (count - i + 1))
  ranks[i] = swapped[j] or j
  swapped[j] = swapped[i - 1] or (i - 1)
end
local cids = {}
for i = 1, n do cids[i] = redis.call('ZRANGE', F.chunks, ranks[i], ranks[i])[1] end
local out = {n}
local used_up = 0
for i = 1, n do
  local cid = cids[i]
  local info = cjson.decode(redis.call('HGET', F.cinfo, cid))
  info.uses = info.uses + 1
  local entry = {cid, cjson.encode(info), current}
  local blobs = redis.call('HMGET', F.frags, unpack(info.fragments))
  for k = 1, #blobs do entry[#entry + 1] = blobs[k] end
  out[#out + 1] = entry
  if info.uses >= max_reuse then
    metric_update(F, 'reuse', info.uses)
    metric_update(F, 'staleness', current - info.version)
    drop_chunk(F, cid, info)
    used_up = used_up + 1
  else
    redis.call('HSET', F.cinfo, cid, cjson.encode(info))
  end
end
redis.call('HINCRBY', F.meta, 'chunks_used_up', used_up)
redis.call('HINCRBY', F.meta, 'fetched', n)
return out
