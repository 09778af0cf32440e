-- Remove every chunk, pending fragment and stored fragment; keep the configuration, the
-- current model version and session, and the id counters (fragment indices per stream
-- included).
-- @keys 9
-- @retry never
-- KEYS[1] meta  KEYS[2..9] frags, finfo, refs, pending, streams, chunks, cinfo, cversions
-- Returns the number of chunks removed. Errors: RB_NOBUF (the buffer was dropped).
if not redis.call('HGET', KEYS[1], 'version') then
  return redis.error_reply('RB_NOBUF fragment buffer meta ' .. KEYS[1] .. ' does not exist')
end
local removed = redis.call('ZCARD', KEYS[7])
for i = 2, #KEYS do
  if i ~= 6 then redis.call('DEL', KEYS[i]) end  -- KEYS[6] streams: indices keep growing
end
return removed
