-- Reading a buffer's snapshot on the server, a helper scripts name with
-- "-- @include snapshot". The snapshot (rb:{name}:snap, written by a following replica,
-- redisbuf/sampling/replica.py write_snapshot) is a hash: header (JSON: format 2, token,
-- epoch, version, stamp, rule, count, chunks, page, total), f (each page's first id,
-- little-endian int64), w (PER: each page's total and largest mass, little-endian
-- float64) and per page k, i<k> (its ids as runs: start and length, little-endian int64)
-- and s<k> (its scores, little-endian float64); every field but header starts with the
-- 8-byte token. Pages hold `page` items in id order. Reads here are of one page's fields
-- at a time (32 KiB), each decoded once per call.
-- @include common

-- The integer whose 8 bytes, little-endian, start at position i of s (0 <= it < 2^53).
local function le_integer_at(s, i)
  local b1, b2, b3, b4, b5, b6, b7, b8 = string.byte(s, i, i + 7)
  return ((((((b8 * 256 + b7) * 256 + b6) * 256 + b5) * 256 + b4) * 256 + b3) * 256 + b2)
    * 256 + b1
end

-- The IEEE 754 double whose 8 bytes, little-endian, start at position i of s. Exact.
local function le_double_at(s, i)
  local b8, b7, b6, b5, b4, b3, b2, b1 = string.byte(s, i, i + 7)
  local sign = 1
  if b1 >= 128 then sign, b1 = -1, b1 - 128 end
  local exponent = b1 * 16 + math.floor(b2 / 16)
  local mantissa = ((((((b2 % 16) * 256 + b3) * 256 + b4) * 256 + b5) * 256 + b6) * 256
    + b7) * 256 + b8
  if exponent == 2047 then
    if mantissa == 0 then return sign * math.huge end
    return 0 / 0
  end
  if exponent == 0 then return sign * mantissa * 2 ^ -1074 end
  return sign * (mantissa + 4503599627370496) * 2 ^ (exponent - 1075)
end

-- The snapshot in `key` when it is of format 2 and of log epoch `epoch`, as a reader:
-- {header, token, key, firsts (each page's first id), pages (a cache)}; nil otherwise.
local function snapshot_open(key, epoch)
  local text = redis.call('HGET', key, 'header')
  if not text then return nil end
  local ok, header = pcall(cjson.decode, text)
  if not ok or type(header) ~= 'table' or tonumber(header['format']) ~= 2
      or header['epoch'] ~= epoch then
    return nil
  end
  local token = ''
  for i = 1, 16, 2 do token = token .. string.char(tonumber(string.sub(header['token'], i, i + 1), 16)) end
  local f = redis.call('HGET', key, 'f') or ''
  if string.sub(f, 1, 8) ~= token then return nil end
  local firsts = {}
  for i = 9, #f, 8 do firsts[#firsts + 1] = le_integer_at(f, i) end
  return {header = header, token = token, key = key, firsts = firsts, pages = {}}
end

-- Page k (0-based) of snapshot S: {ids runs {start, length, offset}..., scores field}, read
-- once per call; nil when a field is missing or of another snapshot (replaced meanwhile).
local function snapshot_page(S, k)
  local page = S.pages[k]
  if page then return page end
  local fields = redis.call('HMGET', S.key, 'i' .. k, 's' .. k)
  if not fields[1] or not fields[2] or string.sub(fields[1], 1, 8) ~= S.token
      or string.sub(fields[2], 1, 8) ~= S.token then
    return nil
  end
  local runs, offset = {}, 0
  for i = 9, #fields[1], 16 do
    local start, length = le_integer_at(fields[1], i), le_integer_at(fields[1], i + 8)
    runs[#runs + 1] = {start, length, offset}
    offset = offset + length
  end
  page = {runs = runs, scores = fields[2], count = offset}
  S.pages[k] = page
  return page
end

-- The score of item `id` (a number) in snapshot S, or nil when the snapshot does not hold
-- it; false when a page is missing (the snapshot was replaced meanwhile).
local function snapshot_score(S, id)
  local firsts = S.firsts
  if #firsts == 0 or id < firsts[1] then return nil end
  local lo, hi = 1, #firsts  -- the last page whose first id is <= id
  while lo < hi do
    local mid = math.floor((lo + hi + 1) / 2)
    if firsts[mid] <= id then lo = mid else hi = mid - 1 end
  end
  local page = snapshot_page(S, lo - 1)
  if not page then return false end
  for _, run in ipairs(page.runs) do
    if id >= run[1] and id < run[1] + run[2] then
      return le_double_at(page.scores, 9 + 8 * (run[3] + id - run[1]))
    end
  end
  return nil
end

-- The position-th item (0-based) of page k of snapshot S: its id and score, or nil.
local function snapshot_item(S, k, position)
  local page = snapshot_page(S, k)
  if not page or position >= page.count then return nil end
  for _, run in ipairs(page.runs) do
    if position < run[3] + run[2] then
      return run[1] + position - run[3], le_double_at(page.scores, 9 + 8 * position)
    end
  end
  return nil
end
