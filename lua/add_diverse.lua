-- Insert a batch into a diverse buffer (torchgfn's NormBasedDiversePrioritizedReplayBuffer
-- rule), atomically with the distance tests.
-- @include common
-- @include tree
-- @include items
-- @include history
-- @include insert
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order (see
-- buffer_keys in _common.lua)
-- ARGV[1] schema (canonical JSON)  ARGV[2] n  ARGV[3] options ("" or a JSON object)
-- ARGV[4] cutoff distance  ARGV[5] p of the p-norm (> 0, or "inf"; 0 counts differing
-- components, as torch.cdist)
-- ARGV[6..] blob_1, log_reward_1, vec_1, ..., blob_n, log_reward_n, vec_n: vec_i is item
-- i's state vector (its terminating state, conditions appended) as comma-separated numbers
-- Rule: while the buffer holds fewer than capacity items, the whole batch is inserted.
-- Once full: items below the lowest stored log-reward are dropped; the rest are ranked by
-- log-reward, descending (batch order among ties); when cutoff >= 0, an item is dropped if
-- its vector is within cutoff (distance <= cutoff) of a higher-ranked item of the batch
-- (dropped or not, as torchgfn), or of any stored item. The survivors are inserted in
-- batch order with reward eviction (insert_batch). Vectors are kept in the vecs hash.
-- Returns {first_id, kept, evicted, position_1..position_kept} (0-based batch positions of
-- the inserted items; first_id is 0 when none was). Errors: RB_NOBUF, RB_SCHEMA,
-- RB_INVALID, RB_CONFIG (not reward eviction, or stored items without a vector).
local K = buffer_keys(KEYS)
local conf, err = buffer_config(K)
if err then return err end
if conf[2] ~= 'reward' then
  return fail('RB_CONFIG', 'a diverse buffer evicts by reward: create it with '
    .. 'prioritized_capacity (this one is ' .. conf[2] .. ')')
end
local n = tonumber(ARGV[2])
local options = {}
if ARGV[3] ~= '' then options = cjson.decode(ARGV[3]) end
local cutoff, p = to_number(ARGV[4]), to_number(ARGV[5])
local blobs, priorities, vec_texts = {}, {}, {}
for i = 1, n do
  blobs[i] = ARGV[3 + 3 * i]
  priorities[i] = ARGV[4 + 3 * i]
  vec_texts[i] = ARGV[5 + 3 * i]
end
err = check_priorities(priorities) or check_schema(conf, ARGV[1])
if err then return err end

local function parse_vec(text)
  local v = {}
  for x in string.gmatch(text, '[^,]+') do v[#v + 1] = tonumber(x) end
  return v
end

-- torch.cdist's p-norm of a - b
local function distance(a, b)
  local sum = 0
  if p == 1 then
    for k = 1, #a do sum = sum + math.abs(a[k] - b[k]) end
    return sum
  elseif p == 2 then
    for k = 1, #a do
      local d = a[k] - b[k]
      sum = sum + d * d
    end
    return math.sqrt(sum)
  elseif p == math.huge then
    for k = 1, #a do sum = math.max(sum, math.abs(a[k] - b[k])) end
    return sum
  elseif p == 0 then
    for k = 1, #a do if a[k] ~= b[k] then sum = sum + 1 end end
    return sum
  end
  for k = 1, #a do sum = sum + math.abs(a[k] - b[k]) ^ p end
  return sum ^ (1 / p)
end

local kept = {}
local count = redis.call('ZCARD', K.order)
if count < tonumber(conf[1]) then
  for i = 1, n do kept[i] = i end
else
  local with_vec = redis.call('HLEN', K.vecs)
  if with_vec < count then
    return fail('RB_CONFIG', (count - with_vec) .. ' stored item(s) have no state vector '
      .. '(added by a plain ReplayBuffer?): a diverse buffer must be filled by diverse adds')
  end
  local lowest = to_number(redis.call('ZRANGE', K.prio, 0, 0, 'WITHSCORES')[2])
  local ranked, reward = {}, {}
  for i = 1, n do
    reward[i] = to_number(priorities[i])
    if reward[i] >= lowest then ranked[#ranked + 1] = i end
  end
  table.sort(ranked, function(a, b)
    if reward[a] ~= reward[b] then return reward[a] > reward[b] end
    return a < b
  end)
  if cutoff >= 0 and #ranked > 0 then
    local vec = {}
    for _, i in ipairs(ranked) do vec[i] = parse_vec(vec_texts[i]) end
    local candidates = {}
    for r = 1, #ranked do
      local distinct = true
      for s = 1, r - 1 do
        if distance(vec[ranked[r]], vec[ranked[s]]) <= cutoff then
          distinct = false
          break
        end
      end
      if distinct then candidates[#candidates + 1] = ranked[r] end
    end
    ranked = {}
    if #candidates > 0 then
      local stored = redis.call('HVALS', K.vecs)
      for j = 1, #stored do stored[j] = parse_vec(stored[j]) end
      for _, i in ipairs(candidates) do
        local distinct = true
        for j = 1, #stored do
          if distance(vec[i], stored[j]) <= cutoff then
            distinct = false
            break
          end
        end
        if distinct then ranked[#ranked + 1] = i end
      end
    end
  end
  table.sort(ranked)
  kept = ranked
end

if #kept == 0 then return {0, 0, 0} end
local kept_blobs, kept_priorities, kept_vecs = {}, {}, {}
for j, i in ipairs(kept) do
  kept_blobs[j], kept_priorities[j], kept_vecs[j] = blobs[i], priorities[i], vec_texts[i]
end
local result = insert_batch(K, conf, ARGV[1], options, kept_blobs, kept_priorities, kept_vecs)
for j, i in ipairs(kept) do result[3 + j] = i - 1 end
return result
