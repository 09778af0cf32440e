-- Rate history, a helper scripts name with "-- @include history".
-- Not an operation of its own; called by the scripts that count inserts (add, and the
-- insert scripts of the other buffer classes: seq_add, episode_push, fragment_add), never
-- by the sampling scripts (sampling must work read-only on a full server).
-- A capped time series in the meta hash: field "hist:<b % HIST_SLOTS>" holds
-- "<b> <inserted> <evicted> <sampled>", the meta counters after the last add of the
-- HIST_STEP-second bucket b (server time); readers diff consecutive buckets. The sampled
-- count is as seen by that add, so sampling shows in buckets that also had an add.
-- Field "last_insert" holds the server time of the last add (seconds, 3 decimals).
-- `fields` names the three counters in the buffer's own meta (default: the plain buffer's
-- "inserted", "evicted", "sampled"; redisbuf/ops/metrics.py's LAYOUTS lists every class's).
local HIST_STEP = 10
local HIST_SLOTS = 360  -- one hour
local HIST_FIELDS = {'inserted', 'evicted', 'sampled'}

local function record_history(meta, fields)
  fields = fields or HIST_FIELDS
  local now = redis.call('TIME')
  local seconds = tonumber(now[1])
  local bucket = math.floor(seconds / HIST_STEP)
  local c = redis.call('HMGET', meta, fields[1], fields[2], fields[3])
  redis.call('HSET', meta,
    'hist:' .. (bucket % HIST_SLOTS),
    bucket .. ' ' .. (c[1] or '0') .. ' ' .. (c[2] or '0') .. ' ' .. (c[3] or '0'),
    'last_insert', string.format('%d.%03d', seconds, math.floor(tonumber(now[2]) / 1000)))
end
