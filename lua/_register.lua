-- Template of the functions library (redisbuf/store/functions.py): one registered
-- function. NAME its name, FLAGS {'no-writes'} or {}, GRANT the grant its caller needs
-- (a quoted name of lua/_grant.lua, or nil: none, for no-writes functions only), CALL what it runs with keys and args
-- (OP.X, ONCE.X or rb_add_checked), LOW and HIGH the number of keys it takes (its
-- script's @keys line; HIGH math.huge: no upper bound), checked before anything runs: a
-- script reads its keys by position, so a call with others would touch the wrong keys.
redis.register_function{function_name = '{{NAME}}', flags = {{FLAGS}},
  callback = function(keys, args)
    if #keys < {{LOW}} or #keys > {{HIGH}} then
      return redis.error_reply('RB_INVALID {{NAME}} takes {{TAKES}} keys, got ' .. #keys)
    end
    local refused = rb_refused(keys, args, {{GRANT}})
    if refused then return refused end
    return {{CALL}}
  end}
