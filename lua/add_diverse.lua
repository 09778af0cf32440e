-- Insert a batch into a diverse buffer (torchgfn's NormBasedDiversePrioritizedReplayBuffer
-- rule), atomically with the distance tests.
-- @include common
-- @include masslog
-- @include items
-- @include history
-- @include insert
-- @keys 13
-- @retry remembered
-- KEYS[1] meta  KEYS[2..] the buffer's other keys, in BufferKeys.all_keys() order (see
-- buffer_keys in _common.lua)
-- ARGV[1] schema (canonical JSON)  ARGV[2] n  ARGV[3] options ("" or a JSON object)
-- ARGV[4] cutoff distance  ARGV[5] p of the p-norm (> 0, or "inf"; 0 counts differing
-- components, as torch.cdist)
-- ARGV[6..] blob_1, log_reward_1, vec_1, ..., blob_n, log_reward_n, vec_n: vec_i is item
-- i's state vector (its terminating state, conditions appended) as comma-separated float32
-- values, 9 significant digits, -0 written as 0 (so equal vectors have equal texts)
-- Rule: while the buffer holds fewer than capacity items, the whole batch is inserted.
-- Once full: items below the lowest stored log-reward are dropped; the rest are ranked by
-- log-reward, descending (batch order among ties); when cutoff >= 0, an item is dropped if
-- its vector is within cutoff (distance <= cutoff) of a higher-ranked item of the batch
-- (dropped or not, as torchgfn), or of any stored item. The survivors are inserted in
-- batch order with reward eviction (insert_batch). Vectors are kept in the vecs hash.
-- Returns {first_id, kept, evicted, position_1..position_kept} (0-based batch positions of
-- the inserted items; first_id is 0 when none was). Errors: RB_LIMIT (n above
-- RB_MAX_ADD, or more than one item of more than RB_MAX_ADD_BYTES in all), RB_NOBUF, RB_SCHEMA, RB_INVALID, RB_CONFIG (not reward eviction, or stored
-- items without a vector).
local K = buffer_keys(KEYS)
local conf, err = buffer_config(K)
if err then return err end
if conf[2] ~= 'reward' then
  return fail('RB_CONFIG', 'a diverse buffer evicts by reward: create it with '
    .. 'prioritized_capacity (this one is ' .. conf[2] .. ')')
end
local n = tonumber(ARGV[2])
if n == nil or n > RB_MAX_ADD then  -- redisbuf/store/bounds.py
  return fail('RB_LIMIT', 'one add stores at most ' .. RB_MAX_ADD .. ' items, got '
    .. tostring(ARGV[2]))
end
local options = batch_options(ARGV[3])
local cutoff, p = to_number(ARGV[4]), to_number(ARGV[5])
local blobs, priorities, vec_texts, bytes = {}, {}, {}, 0
for i = 1, n do
  blobs[i] = ARGV[3 + 3 * i]
  priorities[i] = ARGV[4 + 3 * i]
  vec_texts[i] = ARGV[5 + 3 * i]
  bytes = bytes + #(blobs[i] or '')
end
if n > 1 and bytes > RB_MAX_ADD_BYTES then
  return fail('RB_LIMIT', 'one add of more than one item stores at most ' .. RB_MAX_ADD_BYTES
    .. ' bytes of items, got ' .. bytes)
end
err = check_priorities(priorities) or check_schema(conf, ARGV[1], priorities)
if err then return err end

local abs, huge = math.abs, math.huge

-- Append the numbers of comma-separated texts to flat.
local function parse_into(flat, text)
  for x in string.gmatch(text, '[^,]+') do flat[#flat + 1] = tonumber(x) end
  return flat
end

-- Is torch.cdist's p-norm of a - flat[base+1 .. base+#a] <= cutoff? Partial sums only
-- grow, so the loop stops once past a bound a little above the cutoff (margin for
-- rounding); the final comparison is on the norm itself.
local bound
if p == huge or p == 0 then bound = cutoff
elseif p == 1 then bound = cutoff * (1 + 1e-9)
else bound = (cutoff * (1 + 1e-9)) ^ p end
local function near(a, flat, base)
  local d, sum = #a, 0
  if p == 1 then
    for k = 1, d do
      sum = sum + abs(a[k] - flat[base + k])
      if sum > bound then return false end
    end
    return sum <= cutoff
  elseif p == 2 then
    for k = 1, d do
      local x = a[k] - flat[base + k]
      sum = sum + x * x
      if sum > bound then return false end
    end
    return math.sqrt(sum) <= cutoff
  elseif p == huge then
    for k = 1, d do
      if abs(a[k] - flat[base + k]) > cutoff then return false end
    end
    return true
  elseif p == 0 then
    for k = 1, d do
      if a[k] ~= flat[base + k] then
        sum = sum + 1
        if sum > cutoff then return false end
      end
    end
    return true
  end
  for k = 1, d do
    sum = sum + abs(a[k] - flat[base + k]) ^ p
    if sum > bound then return false end
  end
  return sum ^ (1 / p) <= cutoff
end

-- The ranked items (batch positions, best first) not within cutoff of a higher-ranked
-- one nor of a stored one. At cutoff 0 "within" means equal, and equal float32 vectors
-- have equal texts (9 significant digits; the client writes -0 as 0): a set lookup.
local function diverse(ranked)
  local out = {}
  if cutoff == 0 then
    local seen = {}
    for _, i in ipairs(ranked) do
      if not seen[vec_texts[i]] then out[#out + 1] = i end
      seen[vec_texts[i]] = true
    end
    if #out == 0 then return out end
    local stored = {}
    for _, text in ipairs(redis.call('HVALS', K.vecs)) do stored[text] = true end
    local kept_ = {}
    for _, i in ipairs(out) do
      if not stored[vec_texts[i]] then kept_[#kept_ + 1] = i end
    end
    return kept_
  end
  local vec = {}
  for _, i in ipairs(ranked) do vec[i] = parse_into({}, vec_texts[i]) end
  for r = 1, #ranked do
    local distinct = true
    for s = 1, r - 1 do
      if near(vec[ranked[r]], vec[ranked[s]], 0) then
        distinct = false
        break
      end
    end
    if distinct then out[#out + 1] = ranked[r] end
  end
  if #out == 0 then return out end
  -- For p > 0 a norm is at least any one component's difference, so only stored vectors
  -- whose first component is within cutoff can be near: bucket them by
  -- floor(first / cutoff) and parse just the neighbouring buckets' vectors (and the
  -- "wide" ones whose bucket number is not a safe integer).
  local stored = redis.call('HVALS', K.vecs)
  local d = #vec[out[1]]
  local buckets, parsed, wide = {}, {}, {}
  -- nil where the bucket number is not a safe integer (huge values, tiny cutoffs)
  local function bucket_of(x)
    if p == 0 or cutoff == huge then return nil end
    local key = math.floor(x / cutoff)
    if key ~= key or key > 2 ^ 50 or key < -2 ^ 50 then return nil end
    return key
  end
  for j = 1, #stored do
    local key = bucket_of(tonumber(string.match(stored[j], '^[^,]*')))
    local list = wide
    if key ~= nil then
      list = buckets[key]
      if list == nil then
        list = {}
        buckets[key] = list
      end
    end
    list[#list + 1] = j
  end
  local everything = nil
  local kept_ = {}
  for _, i in ipairs(out) do
    local distinct, key = true, bucket_of(vec[i][1])
    local lists
    if key ~= nil then
      lists = {wide, buckets[key - 1] or {}, buckets[key] or {}, buckets[key + 1] or {}}
    else
      if everything == nil then
        everything = {}
        for j = 1, #stored do everything[j] = j end
      end
      lists = {everything}
    end
    for _, list in ipairs(lists) do
      for _, j in ipairs(list) do
        local other = parsed[j]
        if other == nil then
          other = parse_into({}, stored[j])
          if #other ~= d then
            return nil, fail('RB_CONFIG', 'a stored state vector has ' .. #other
              .. ' components, this batch ' .. d .. ' (the buffer holds other states)')
          end
          parsed[j] = other
        end
        if near(vec[i], other, 0) then
          distinct = false
          break
        end
      end
      if not distinct then break end
    end
    if distinct then kept_[#kept_ + 1] = i end
  end
  return kept_
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
  local lowest = 0  -- no log-rewards stored: every item's is 0
  if rewards_kept(K) then
    lowest = to_number(redis.call('ZRANGE', K.prio, 0, 0, 'WITHSCORES')[2])
  end
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
    ranked, err = diverse(ranked)
    if err then return err end
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
