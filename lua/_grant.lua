-- Template of the functions library (redisbuf/store/functions.py), nothing to fill: the
-- grant check of every registered function that changes a buffer. ACL has no
-- per-function rule, so the functions check it themselves (redis.acl_check_cmd): the
-- caller needs PUBLISH permission on the channel rb:{NAME}:grant:GRANT of the buffer its
-- KEYS[1] belongs to (the roles of redisbuf/ops/acl.py; functions.GRANTS says which grant
-- each script asks). A user with every channel (the default user) or the buffer's
-- (rb:{NAME}:*, the admin role) passes every check. grant nil asks nothing: only the
-- read-only (no-writes) functions pass nil; a script without an entry in functions.GRANTS
-- asks "admin" (functions.grant_of).
-- "rate": rate_limit.lua admits inserts (actor) and samples (learner): ARGV[1] says which.
-- "apply": add_apply.lua stores the rest of a large add that a writer committed, which
-- every call on the buffer waits for: any of "add", "sample" and "priority" allows it.
-- "config": the settings every opening process passes: "admin" when one is given,
-- nothing when none is. "create": "admin" when the buffer does not exist yet.
-- Returns nil when allowed, else a NOPERM error reply.
local RB_GRANT_VERBS = {add = 'add to', sample = 'sample from',
  priority = 'update the priorities of', admin = 'configure, clear or restore'}
local function rb_refused(keys, args, grant)
  if grant == nil then return nil end
  if grant == 'rate' then
    local op = args[1]
    grant = (op == 'insert' or op == 'unsert' or op == 'insert_upto' or op == 'can_insert')
      and 'add' or 'sample'
  elseif grant == 'config' then
    -- every process opening the buffer calls it; with nothing asked it only reads
    local asked = false
    for i = 1, #args do asked = asked or args[i] ~= '' end
    if not asked then return nil end
    grant = 'admin'
  elseif grant == 'create' then
    -- every process opening the buffer with a capacity calls it; on an existing buffer it
    -- only reads (the caller compares the settings)
    if redis.call('EXISTS', keys[1]) == 1 then return nil end
    grant = 'admin'
  end
  local prefix = string.match(tostring(keys[1]), '^rb:{[^}]*}:')
  if not prefix then
    return redis.error_reply('RB_INVALID KEYS[1] must be a key of a buffer (rb:{NAME}:...)')
  end
  -- a server without ACL checks in Lua (fakeredis) has no users to tell apart
  if not redis.acl_check_cmd then return nil end
  if grant == 'apply' then
    for _, kind in ipairs({'add', 'sample', 'priority'}) do
      if redis.acl_check_cmd('PUBLISH', prefix .. 'grant:' .. kind, '') then return nil end
    end
    grant = 'add'
  end
  local channel = prefix .. 'grant:' .. grant
  if redis.acl_check_cmd('PUBLISH', channel, '') then return nil end
  return redis.error_reply('NOPERM this user may not ' .. RB_GRANT_VERBS[grant] .. ' buffer '
    .. string.sub(prefix, 5, -3) .. ' (its ACL role grants no PUBLISH on ' .. channel
    .. ', see redisbuf acl)')
end
