-- Undo the reservation of a batch whose commit the server refused (ReplayBuffer._commit in
-- redisbuf/buffers/replay.py): a MULTI/EXEC aborted before add_commit.lua ran (OOM at maxmemory,
-- EXECABORT), or add_commit.lua's own refusal. A refused batch then leaves last_id and the
-- batch memory as they were.
-- @include common
-- @keys 4
-- @retry never
-- KEYS[1] meta  KEYS[2] items  KEYS[3] batch memory  KEYS[4] its older generation
-- ARGV[1] first_id  ARGV[2] n  ARGV[3] batch id (the one add_reserve.lua remembered its
-- reply under)  ARGV[4] "1": give the ids back (last_id -= n unless a later batch reserved
-- ids since); "0": add_commit.lua already did
-- Runs once per reservation: only while the memory holds the reservation's reply (tag "r",
-- see _REMEMBER in redisbuf/store/scripts.py), which it deletes first; a committed batch (tag
-- "c") or a second call changes nothing. Returns 1 when it released, else 0.
-- The first write is an HDEL, which Redis allows at maxmemory (no denyoom flag): after a
-- script's first write its later ones are allowed too, so the HINCRBY below, which alone
-- would be refused there, goes through (a shebang's allow-oom would say so, but fakeredis
-- does not parse shebangs).
local first, n, batch = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local found = nil
for _, key in ipairs({KEYS[3], KEYS[4]}) do
  local seen = redis.call('HGET', key, batch)
  if seen and string.sub(seen, 1, 1) == 'r' then found = key end
end
if not found then return 0 end
redis.call('HDEL', found, batch)
local ids = {}
for i = 1, n do ids[i] = id_str(first + i - 1) end
call_chunked('HDEL', KEYS[2], ids)
if ARGV[4] == '1' then
  local last = redis.call('HGET', KEYS[1], 'last_id')
  if last and tonumber(last) == first + n - 1 then
    redis.call('HINCRBY', KEYS[1], 'last_id', -n)
  end
end
return 1
