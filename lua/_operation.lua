-- Template of the functions library (redisbuf/store/functions.py): one script of lua/
-- (NAME: HELPERS, the helpers it includes, and SCRIPT, its own text) as the library's
-- OP.NAME(KEYS, ARGV, RB_NO_WRITES), so its globals and top-level return keep their
-- meaning, and its remembering variant ONCE.NAME(KEYS, ARGV): lua/_remember.lua around a
-- call of OP.NAME (ONCE). LIMITS is lua/_limits.lua, filled. The helpers are locals of a
-- function of the operation's own, run once when the library loads (no limit on locals
-- or upvalues is shared between operations), so a call does not make them again: they
-- hold no state of their own and read the call's RB_NO_WRITES, which each call sets.
OP.{{NAME}} = (function()
local RB_NO_WRITES
{{LIMITS}}{{HELPERS}}
return function(KEYS, ARGV, no_writes)
RB_NO_WRITES = no_writes
{{SCRIPT}}
end
end)()
ONCE.{{NAME}} = function(KEYS, ARGV)
{{ONCE}}
end
