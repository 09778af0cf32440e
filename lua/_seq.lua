-- Per-environment streams (SequenceBuffer), a helper scripts name with
-- "-- @include seq". Not an operation of its own.
-- Keys (redisbuf/buffers/sequence.py, SequenceKeys.all_keys() order): meta, steps, envs, episodes,
-- begins, rewards, returns, prio, masslog, snap. A step is named by its environment e and its
-- position p (positions only grow); its fields are "e:p". An episode is named by the member
-- "eeeeee:ppppppppppppppp" (env and the position it began at, zero-padded so that the
-- lex order of `begins` is (env, begin) order); `episodes` scores it with the number of
-- its steps still stored.
-- Prioritized buffers keep each stored step's priority in the prio hash under its slot
-- (slot_of: one fixed slot per ring index, written as item ids are: 12 digits, id_str)
-- and, as the replay buffer's prioritized sampling does, append every change to it to
-- the mass log (lua/_masslog.lua: ids are slots, scores priorities; meta masslog = 1 and
-- mass = per with alpha 1 and eps 0, so a slot's mass is its priority); samplers
-- draw from replicas of it (redisbuf/sampling/replica.py) and lua/seq_sample.lua checks
-- the draws.
-- @include common
-- @include masslog

local function seq_keys(keys)
  return {
    meta = keys[1], steps = keys[2], envs = keys[3], episodes = keys[4], begins = keys[5],
    rewards = keys[6], returns = keys[7], prio = keys[8], masslog = keys[9], snap = keys[10],
  }
end

local function step_field(e, p)
  return string.format('%d:%d', e, p)
end

local function episode_member(e, p)
  return string.format('%06d:%015d', e, p)
end

local function parse_member(member)
  return tonumber(string.sub(member, 1, 6)), tonumber(string.sub(member, 8))
end

-- The configuration fields every script reads, as numbers / flags.
local function seq_conf(K)
  local raw = redis.call('HMGET', K.meta, 'num_environments', 'max_length', 'returns',
    'gamma', 'default_return', 'clip_low', 'clip_high', 'prioritized', 'initial_priority')
  if not raw[1] then return nil end
  return {
    num_envs = tonumber(raw[1]), max_length = tonumber(raw[2]), returns = raw[3] == '1',
    gamma = tonumber(raw[4]), default_return = tonumber(raw[5]),
    clip_low = to_number(raw[6]), clip_high = to_number(raw[7]),
    prioritized = raw[8] == '1', initial_priority = tonumber(raw[9]),
  }
end

-- The stream state of environment e: next (position the next step gets), start (oldest
-- stored position; next == start when empty), cur (begin of the newest episode), first
-- (begin of the oldest stored episode), ended (the newest step ended its episode).
local function env_state(K, e)
  local raw = redis.call('HMGET', K.envs, 'next:' .. e, 'start:' .. e, 'cur:' .. e,
    'first:' .. e, 'ended:' .. e)
  return {
    next = tonumber(raw[1]) or 0, start = tonumber(raw[2]) or 0,
    cur = tonumber(raw[3]) or 0, first = tonumber(raw[4]) or 0, ended = raw[5] == '1',
  }
end

local function save_env_state(K, e, S)
  redis.call('HSET', K.envs, 'next:' .. e, S.next, 'start:' .. e, S.start,
    'cur:' .. e, S.cur, 'first:' .. e, S.first, 'ended:' .. e, S.ended and 1 or 0)
end

-- The slot of step (e, p) in the prio hash and the mass log: one fixed slot per ring
-- index, so a step that evicts another takes its slot.
local function slot_of(C, e, p)
  return e * C.max_length + p % C.max_length
end

-- Set step priorities: changes is a list of {slot, priority (a number) or false (the
-- step is gone)}, a later entry for a slot winning. One HMGET and one HSET / HDEL of the
-- prio hash and one mass-log entry (old and new priority of each slot, "nan" for none)
-- for the whole call, whatever the buffer's size. Keeps meta "nonzero" (stored steps of
-- non-zero priority: importance weights divide by the mean non-zero priority, as ALF,
-- so that a priority set to 0, ALF's way to exclude a window, does not inflate the
-- others) and "prio_sum" (their sum, with its Neumaier compensation "prio_comp", so long
-- update sequences do not drift). Returns the slots set (text) and their new priorities
-- (text, "nan" for gone), as logged.
local function seq_set_priorities(K, changes)
  local final, order = {}, {}
  for _, change in ipairs(changes) do
    if final[change[1]] == nil then order[#order + 1] = change[1] end
    final[change[1]] = change[2]
  end
  if #order == 0 then return {}, {} end
  local fields = {}
  for i, slot in ipairs(order) do fields[i] = id_str(slot) end
  local olds = hmget_chunked(K.prio, fields)
  local conf = redis.call('HMGET', K.meta, 'nonzero', 'prio_sum', 'prio_comp')
  local nonzero, sum, comp = tonumber(conf[1]) or 0, tonumber(conf[2]) or 0, tonumber(conf[3]) or 0
  local function push(x)
    local t = sum + x
    if math.abs(sum) >= math.abs(x) then comp = comp + ((sum - t) + x)
    else comp = comp + ((x - t) + sum) end
    sum = t
  end
  local set_pairs, gone, old_texts, new_texts = {}, {}, {}, {}
  for i, field in ipairs(fields) do
    local old, new = tonumber(olds[i]), final[order[i]]
    if old and old > 0 then
      nonzero = nonzero - 1
      push(-old)
    end
    old_texts[i] = olds[i] or 'nan'
    if new then
      local text = fmt(new)
      if new > 0 then
        nonzero = nonzero + 1
        push(new)
      end
      set_pairs[#set_pairs + 1] = field
      set_pairs[#set_pairs + 1] = text
      new_texts[i] = text
    else
      gone[#gone + 1] = field
      new_texts[i] = 'nan'
    end
  end
  if nonzero <= 0 then nonzero, sum, comp = 0, 0, 0 end
  call_chunked('HSET', K.prio, set_pairs)
  call_chunked('HDEL', K.prio, gone)
  redis.call('HSET', K.meta, 'nonzero', nonzero, 'prio_sum', fmt(sum), 'prio_comp', fmt(comp))
  masslog_append(K, fields, old_texts, new_texts)
  return fields, new_texts
end

-- Remove the oldest stored step of e (S.start) from every structure; its priority's
-- removal is added to `changes` (see seq_set_priorities) when given.
local function evict_oldest(K, C, e, S, changes)
  local s = S.start
  local field = step_field(e, s)
  redis.call('HDEL', K.steps, field)
  if C.returns then
    redis.call('HDEL', K.rewards, field)
    redis.call('HDEL', K.returns, field)
  end
  if changes then changes[#changes + 1] = {slot_of(C, e, s), false} end
  local member = episode_member(e, S.first)
  local left = tonumber(redis.call('ZINCRBY', K.episodes, -1, member))
  if left <= 0 then
    -- the oldest episode is gone; the step after it began the next one
    redis.call('ZREM', K.episodes, member)
    redis.call('ZREM', K.begins, member)
    S.first = s + 1
  end
  S.start = s + 1
  redis.call('HINCRBY', K.meta, 'size', -1)
end

-- The episode holding stored step (e, p): its begin (maybe no longer stored) and its last
-- stored position.
local function episode_of(K, e, p, S)
  local found = redis.call('ZREVRANGEBYLEX', K.begins, '[' .. episode_member(e, p),
    '[' .. episode_member(e, 0), 'LIMIT', 0, 1)
  local member = found[1]
  local _, begin = parse_member(member)
  local length = tonumber(redis.call('ZSCORE', K.episodes, member))
  return begin, math.max(begin, S.start) + length - 1
end

