"""How items and keys live in Redis: connections, key layout, Lua scripts and the FCALL
library, the item codec and the container kinds."""
