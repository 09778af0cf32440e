"""A large add: more items (or bytes) than one add command may store, stored atomically.

``ReplayBuffer.add`` of a batch above one add's bound (:data:`~redisbuf.store.bounds.
MAX_ADD_ITEMS` items, :data:`~redisbuf.store.bounds.MAX_ADD_BYTES` bytes) goes here:

1. **stage**: each slice an add may carry (:func:`~redisbuf.store.bounds.add_slices`, and
   at most :data:`SLICE_BYTES` of blobs) is
   one MULTI/EXEC of a native HSET of its blobs and ``lua/add_stage.lua``, which checks
   and stores its log-rewards and PER priorities, under ``rb:{NAME}:adding:BATCH:*``: keys
   no reader looks at, which expire unless committed, so a writer that dies here leaves
   nothing;
2. **commit**: ``lua/add_staged.lua`` (remembered under the batch id, so a retry after a
   lost reply does not commit twice) admits the batch, reserves its ids, turns the staged
   keys into the buffer's applying keys and stores the first slice; from then on every
   other script on the buffer refuses (``RB_APPLYING``) until the add is stored whole;
3. **apply**: ``lua/add_apply.lua`` stores a slice a call, as one add does; any caller that
   meets ``RB_APPLYING`` runs it too (redisbuf/store/applying.py), so a writer that dies
   after its commit blocks nobody.

Each command stores at most one add's worth, so none stalls the server for longer than an
add does, and every redisbuf read sees all of the batch or none of it.
"""

from __future__ import annotations

import json
from typing import Any

import redis

from ..errors import RedisBufError
from ..store import applying, bounds, scripts
from ..store.connection import retrying
from ..store.keys import BufferKeys

# Bytes of blobs a slice holds at most: a step of the apply carries its slice's blobs
# through Lua (an add's own go in by a native HSET), which costs per byte, so a slice holds
# a quarter of what an add may, keeping a step's command near an add's.
SLICE_BYTES = 8 * 1024 * 1024

# Milliseconds staged slices live after the last one was sent, unless committed: enough
# for a writer between two slices, short enough to free a dead writer's soon.
STAGE_TTL_MS = 600_000


def _stage(
    client: Any, keys: BufferKeys, batch_id: str, blobs: list[bytes], texts: list[str],
    per_texts: list[str] | None, schema_json: str,
) -> None:
    """Send every slice (a MULTI/EXEC each: the native HSET of its blobs, then
    ``add_stage``); raises the server's refusal of a slice, the staged keys then deleted."""
    staged = keys.adding(batch_id)
    script = scripts.load("add_stage")
    meta = [keys.meta, *staged]
    for start, stop in bounds.add_slices([len(blob) for blob in blobs], SLICE_BYTES):
        fields: list[Any] = []
        for index in range(start, stop):
            fields += [str(index), blobs[index]]
        args: list[Any] = [schema_json, STAGE_TTL_MS, start, stop - start,
                           int(per_texts is not None), *texts[start:stop]]
        if per_texts is not None:
            args += per_texts[start:stop]

        def send(fields: list[Any] = fields, args: list[Any] = args) -> Any:
            for load in (False, True):
                if load:
                    scripts.reload(client, script)
                pipe = client.pipeline(transaction=False)
                pipe.execute_command("MULTI")
                pipe.execute_command("HSET", staged[0], *fields)
                scripts.queue(pipe, client, script, meta, args)
                pipe.execute_command("EXEC")
                executed = pipe.execute(raise_on_error=False)[3]
                if isinstance(executed, Exception):
                    raise executed
                reply = executed[1]
                if not (scripts.missing(reply) and not load):
                    return reply
            raise AssertionError("unreachable")

        reply = retrying(send, name=client)  # the same fields again: safe to repeat
        if isinstance(reply, Exception):
            client.delete(*staged)
            if isinstance(reply, redis.exceptions.ResponseError):
                raise scripts.translate(reply)
            raise reply


def _store_the_rest(client: Any, keys: BufferKeys) -> None:
    """The apply's steps after the commit (the writer's own; anyone else's would do)."""
    applying.finish(client, keys.meta)


def insert_large(
    client: Any, keys: BufferKeys, blobs: list[bytes], texts: list[str],
    schema_json: str, options: dict[str, Any], memory: tuple[str, list[str], float],
) -> list[Any]:
    """Stage, commit and apply a large add (see the module docstring). ``options`` as
    ``add_reserve``'s (``per_priorities`` staged with the items, not sent in it); ``memory``
    the commit's batch (``Inserting._memory``). Returns ``[first id, n, evicted]``, or the
    commit's refusal ``[0, 0, 0, reason]`` (stale, another session)."""
    batch_id = memory[0]
    per_texts = options.pop("per_priorities", None)
    if per_texts is not None:
        options["per_given"] = True
    _stage(client, keys, batch_id, blobs, texts, per_texts, schema_json)
    commit = scripts.load("add_staged")
    commit_keys = [*keys.all_keys(), *keys.adding(batch_id), *keys.applying_keys()]
    args = [schema_json, len(blobs), json.dumps(options) if options else "",
            batch_id, scripts.tag_of("add_staged")]
    def drop_staged() -> None:
        retrying(lambda: client.delete(*keys.adding(batch_id)), name=client)

    try:
        reply = retrying(lambda: commit(client, commit_keys, args, batch=memory), name=client)
    except RedisBufError:  # refused before any write: its staged slices go too
        drop_staged()
        raise
    if len(reply) == 4 and int(reply[0]) == 0:  # refused by admission (counted)
        drop_staged()
        return list(reply)
    if len(reply) == 4 and not int(reply[3]):  # (3 long: the whole add's, remembered)
        _store_the_rest(client, keys)
    # the last step (whoever ran it) left the whole add's reply in the batch memory
    whole = retrying(lambda: scripts.read_remembered(client, memory[1], batch_id, "add_staged"),
                     name=client)
    if whole is None:  # forgotten already (a window shorter than the add): its ids stand
        return [int(reply[0]), int(reply[1]), int(reply[2])]
    return [int(value) for value in whole[:3]]
