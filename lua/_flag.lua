-- Template, filled by redisbuf/store/scripts.py (Script): the first line of every script
-- run with EVALSHA. RB_NO_WRITES is true in a script's read-only variant (run under the
-- no-writes shebang), where record_draws skips its counter writes; in the functions
-- library it is each operation's third parameter instead (lua/_operation.lua).
local RB_NO_WRITES = {{NO_WRITES}}
