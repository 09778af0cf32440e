-- Template of the functions library (redisbuf/store/functions.py): one registered
-- function. NAME its name, FLAGS {'no-writes'} or {}, GRANT the grant its caller needs
-- (a quoted name of lua/_grant.lua, or nil: none), CALL what it runs with keys and args
-- (OP.X, ONCE.X or rb_add_checked).
redis.register_function{function_name = '{{NAME}}', flags = {{FLAGS}},
  callback = function(keys, args)
    local refused = rb_refused(keys, args, {{GRANT}})
    if refused then return refused end
    return {{CALL}}
  end}
