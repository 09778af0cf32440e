-- Template of the functions library (redisbuf/store/functions.py): one script of lua/
-- (NAME, its includes expanded: SCRIPT) as the library's OP.NAME(KEYS, ARGV, RB_NO_WRITES),
-- so its globals and top-level return keep their meaning and its helpers are locals of
-- its own function (no limit on locals or upvalues is shared between operations), and
-- its remembering variant ONCE.NAME(KEYS, ARGV): lua/_remember.lua around a call of
-- OP.NAME (ONCE). LIMITS is lua/_limits.lua, filled.
OP.{{NAME}} = function(KEYS, ARGV, RB_NO_WRITES)
{{LIMITS}}{{SCRIPT}}
end
ONCE.{{NAME}} = function(KEYS, ARGV)
{{ONCE}}
end
