-- Delete a buffer entirely (ReplayBuffer.drop): UNLINK every key given, the large ones
-- freed by the server in the background. A script rather than a native UNLINK so that
-- the per-buffer roles (redisbuf/ops/acl.py) refuse it to all but the admin, as they
-- refuse clear.lua.
-- @keys 1..
-- @retry never
-- KEYS[1] meta  KEYS[2..] the buffer's other keys and what else of it the caller found
-- (BufferKeys.owns: the control plane's, a load's staging keys)
-- ARGV none
-- Returns the number of keys that existed.
local removed = 0
for i = 1, #KEYS do removed = removed + redis.call('UNLINK', KEYS[i]) end
return removed
