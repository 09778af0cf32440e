-- Template of the functions library (redisbuf/store/functions.py), the whole of it:
-- LIBRARY its name; VERSION a hash of this template with everything but VERSION filled
-- (rb_version returns it); DEFAULT_WINDOW the batch memory's window in seconds where a
-- buffer's meta has no retry_window; MAX_ADD redisbuf/store/bounds.py's; BODY
-- lua/_grant.lua, every operation (lua/_operation.lua) and lua/_add_checked.lua;
-- REGISTRATIONS every registered function (lua/_register.lua) but rb_version.
#!lua name={{LIBRARY}}
-- redisbuf {{VERSION}}
local DEFAULT_WINDOW = {{DEFAULT_WINDOW}}
local RB_MAX_ADD = {{MAX_ADD}}
local OP, ONCE = {}, {}
{{BODY}}
redis.register_function{function_name = 'rb_version', flags = {'no-writes'},
  callback = function() return '{{VERSION}}' end}
{{REGISTRATIONS}}
