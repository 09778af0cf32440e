"""What keys hold, by value, for "nothing was written" checks.

DUMP bytes are not a value: a hash stored as a hashtable may be serialised in another
order after a mere read (Redis rehashes its tables incrementally, on lookups too), so
two DUMPs of an unchanged key can differ.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def key_contents(client: Any, keys: Iterable[Any]) -> dict[Any, Any]:
    """Each key -> (type, value): a hash's fields, a zset's members and scores, a list's
    items, a set's members, a string's bytes; absent keys -> None."""
    out: dict[Any, Any] = {}
    for key in keys:
        kind = client.type(key)
        kind = kind.decode() if isinstance(kind, bytes) else kind
        if kind == "hash":
            value: Any = client.hgetall(key)
        elif kind == "zset":
            value = client.zrange(key, 0, -1, withscores=True)
        elif kind == "list":
            value = client.lrange(key, 0, -1)
        elif kind == "set":
            value = sorted(client.smembers(key))
        elif kind == "string":
            value = client.get(key)
        elif kind == "none":
            out[key] = None
            continue
        else:
            value = client.dump(key)
        out[key] = (kind, value)
    return out
