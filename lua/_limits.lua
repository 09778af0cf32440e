-- Template, filled by redisbuf/store/scripts.py from redisbuf/store/bounds.py: the bounds
-- on one command's items and one add's bytes, which scripts enforce. Pasted at the top of
-- every script run with EVALSHA and of every operation of the functions library.
local RB_MAX_ITEMS, RB_MAX_ADD = {{MAX_ITEMS}}, {{MAX_ADD}}
local RB_MAX_ADD_BYTES = {{MAX_ADD_BYTES}}
