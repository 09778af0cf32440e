-- Template, filled by redisbuf/store/scripts.py (Script.remembering) and
-- redisbuf/store/functions.py (ONCE.NAME): the remembering variant of a script. BODY is the
-- script's body (or, in the library, a call of OP.NAME), whose reply is kept under the
-- batch id (see Script.__call__); TAG is the script's one-character tag (scripts.tag_of),
-- which keeps a script from taking another's reply kept under the same id (add's two
-- calls share one: the commit's reply replaces the reservation's).
-- KEYS: the script's own, then the batch memory (rb:{name}:batches) and its older
-- generation (rb:{name}:batches:old), taken off the end before the body runs.
-- ARGV: the script's own, then the batch id and the window in ms, taken off the end too.
-- Memory is two generations of one hash each instead of a hash and a time zset: an entry
-- costs one small hash field (the id, the tag and the reply's JSON), and forgetting is one
-- UNLINK + RENAME when the current generation (begun at its field "~since", server ms) is
-- older than the window, so an id is remembered for at least the window and at most about
-- twice it. Error replies are not remembered, nor anything once the meta (KEYS[1]) is gone.
local rb_window_ms = tonumber(table.remove(ARGV))
local rb_batch = table.remove(ARGV)
local rb_older = table.remove(KEYS)
local rb_memory = table.remove(KEYS)
local rb_seen = redis.call('HGET', rb_memory, rb_batch)
local rb_in_older = false
if not rb_seen then
  rb_seen = redis.call('HGET', rb_older, rb_batch)
  rb_in_older = rb_seen ~= false
end
if rb_seen and string.sub(rb_seen, 1, 1) == '{{TAG}}' then
  return cjson.decode(string.sub(rb_seen, 2))
end
local function rb_body()
{{BODY}}
end
local rb_reply = rb_body()
if type(rb_reply) == 'table' and (rb_reply.err or rb_reply.ok) then return rb_reply end
if redis.call('EXISTS', KEYS[1]) == 1 then
  local rb_time = redis.call('TIME')
  local rb_now = tonumber(rb_time[1]) * 1000 + math.floor(tonumber(rb_time[2]) / 1000)
  local rb_since = tonumber(redis.call('HGET', rb_memory, '~since'))
  if rb_since and rb_now - rb_since >= rb_window_ms then
    redis.call('UNLINK', rb_older)
    redis.call('RENAME', rb_memory, rb_older)
    rb_since = nil
  elseif rb_in_older then
    redis.call('HDEL', rb_older, rb_batch)
  end
  if not rb_since then redis.call('HSET', rb_memory, '~since', rb_now) end
  redis.call('HSET', rb_memory, rb_batch, '{{TAG}}' .. cjson.encode(rb_reply))
end
return rb_reply
