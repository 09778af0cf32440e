-- Commit a large add staged by lua/add_stage.lua (redisbuf/buffers/staged.py): check it,
-- admit it, reserve its ids, make its staged keys the buffer's applying keys and store its
-- first slice (lua/_apply.lua); lua/add_apply.lua stores the others. From here the add
-- lands whole: every other script on the buffer refuses with RB_APPLYING until it has.
-- @include apply
-- @keys 18
-- @retry remembered
-- KEYS[1] meta  KEYS[2..13] the buffer's other keys, in BufferKeys.all_keys() order
-- KEYS[14] the staged blobs  KEYS[15] the staged texts (rb:{NAME}:adding:BATCH:*)
-- KEYS[16..18] the applying keys: state, blobs, texts (rb:{NAME}:applying, :applying:blobs,
-- :applying:texts)
-- ARGV[1] schema (canonical JSON)  ARGV[2] n  ARGV[3] options: "" or a JSON object (see
-- insert_batch in _insert.lua; "per_given": true when PER priorities were staged)
-- ARGV[4] the batch id  ARGV[5] the tag of this script's remembered replies
-- (scripts.tag_of), under which the last step keeps the whole add's reply
-- Returns {first_id, n, evicted so far, 1 when stored whole else 0}, or {0, 0, 0, reason}
-- when admit_batch refuses the batch (stale, another session: only its counter is
-- written; the staged keys expire). Errors (nothing written): RB_NOBUF, RB_SCHEMA,
-- RB_CONFIG (PER priorities on a buffer without PER), RB_NOHEAP, RB_INVALID (not every item
-- staged: a slice expired or is missing), RB_APPLYING (another large add is being stored).
local K = buffer_keys(KEYS)
local staged_blobs, staged_texts = KEYS[14], KEYS[15]
local A = applying_keys(KEYS, 16)
local conf, err = buffer_config(K)
if err then return err end
err = check_schema(conf, ARGV[1], nil)
if err then return err end
local n = tonumber(ARGV[2])
local options = batch_options(ARGV[3])
if n == nil or n < 1 then return fail('RB_INVALID', 'ARGV[2] must be the number of items') end
local blobs_staged = redis.call('HLEN', staged_blobs)
local texts_staged = redis.call('HLEN', staged_texts)
-- per item: its log-reward and, with PER priorities, "p" .. position; per slice "s" .. start
local per_item = options.per_given and 2 or 1
if blobs_staged ~= n or texts_staged < per_item * n then
  return fail('RB_INVALID', 'the large add ' .. ARGV[4] .. ' has ' .. blobs_staged .. ' of '
    .. n .. ' items staged (a slice expired or was never sent); nothing was stored')
end
if options.per_given and not per_enabled(K) then
  return fail('RB_CONFIG', 'buffer ' .. K.meta .. ' has no PER priorities: priorities= '
    .. 'needs PERSampler')
end
local admitted = {session_id = options.session_id, model_version = options.model_version}
local first, refused = reserve_ids(K, n, admitted)
if refused then return {0, 0, 0, refused} end
redis.call('RENAME', staged_blobs, A.blobs)
redis.call('RENAME', staged_texts, A.texts)
redis.call('PERSIST', A.blobs)
redis.call('PERSIST', A.texts)
redis.call('HSET', A.state, 'first', first, 'n', n, 'next', 0, 'evicted', 0,
  'schema', ARGV[1], 'options', ARGV[3], 'batch', ARGV[4], 'tag', ARGV[5])
redis.call('HSET', K.meta, 'applying', ARGV[4])
local step = apply_step(K, A)
return {first, n, step[4], step[1]}
