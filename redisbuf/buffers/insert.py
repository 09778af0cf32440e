"""How ``ReplayBuffer.add`` stores a batch, exactly once: the add transaction.

``add_reserve`` checks the batch and reserves its ids; one MULTI/EXEC then writes the
blobs with a native HSET and runs ``add_commit`` (priorities, order, eviction, the mass
log), so the blobs never pass through Lua and readers see the whole batch or none of it.
The server remembers each batch id and its reply for ``retry_window`` seconds: a retry
after a lost reply gets the first reply back instead of storing the batch twice. A commit
the server refuses gives its reservation back (``add_release``). The other buffer kinds'
single inserting scripts go through :meth:`Inserting._insert_with`.
"""

from __future__ import annotations

import base64
import json
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import redis

from ..errors import (
    ApplyingError,
    RequestTooLargeError,
    SchemaError,
    ServerFullError,
    ServerUnavailableError,
)
from ..store import applying, bounds, scripts
from ..store.connection import check_durability, durability_wait, retrying
from ..store.containers import schema_to_json
from ..store.keys import BufferKeys, format_id
from . import staged

if TYPE_CHECKING:
    from .needs import InsertingNeeds as _InsertingNeeds
else:
    _InsertingNeeds = object  # for type checkers only: see redisbuf/buffers/needs.py


def check_add_bound(name: str, blobs: list[bytes], why: str = "") -> None:
    """Refuse a batch one add command may not store (redisbuf/store/bounds.py) where no
    large add (redisbuf/buffers/staged.py) may store it either (``why`` says why not): an
    add is atomic, so it is refused, not split."""
    refusal = bounds.add_refusal(len(blobs), sum(len(blob) for blob in blobs))
    if refusal is not None:
        raise RequestTooLargeError(
            f"buffer {name!r}: {refusal}{why}, so that no command stalls the server: add it "
            "in several batches (redisbuf.store.bounds.add_slices); nothing was written"
        )


@dataclass
class AddResult:
    """What one ``add`` did: the ids given to the batch's items (in batch order), how many
    items the insertion evicted (possibly some of these new ones, under prioritized
    capacity), and the manager's score dict when a remote manager is configured.

    Attributes:
        ids: the new items' ids, in batch order (int64).
        evicted: how many items the insertion evicted.
        score: the manager's score dict, or ``None``.
        rejected: ``"stale"`` or ``"session"`` when the batch was refused (nothing
            stored), else ``None``.

    Examples:
        >>> import fakeredis, numpy as np
        >>> from redisbuf import ReplayBuffer
        >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo")
        >>> buffer.add({"obs": np.arange(2.0), "log_rewards": np.zeros(2)})
        AddResult(ids=array([1, 2]), evicted=0, score=None, rejected=None)
    """

    ids: np.ndarray
    evicted: int
    score: dict[str, float] | None = None
    rejected: str | None = None  # "stale" or "session": the batch was refused, not stored


def _batch_id() -> str:
    """A random batch id: 96 bits in 16 characters (a remembered batch costs its id)."""
    return base64.urlsafe_b64encode(os.urandom(12)).decode()


def _priority_text(value: float) -> str:
    return "-inf" if value == -math.inf else repr(float(value))


def _refusal(reply: Any) -> str | None:
    """Why an inserting script refused a batch ("stale", "session"; see admit_batch in
    lua/_items.lua), or None when it stored it."""
    if isinstance(reply, list) and len(reply) == 4 and reply[0] == 0:
        return reply[3].decode() if isinstance(reply[3], bytes) else str(reply[3])
    return None




class Inserting(_InsertingNeeds):
    """The methods of :class:`~redisbuf.buffers.replay.ReplayBuffer` that store a batch
    (a mixin: the buffer provides ``client``, ``keys``, ``retry_window``, the durability
    settings, ``_run`` and its schema cache, ``_check_schema`` and ``_schema_refusal``)."""

    # set by ReplayBuffer.__init__
    client: Any
    keys: BufferKeys
    retry_window: float
    durability: str | None
    durability_timeout: float
    # the schema cache (Opening's), set by the first add
    _schema: dict[str, Any] | None
    _schema_json: str | None
    kind: str | None

    def _memory(self, keys: BufferKeys, batch_id: str | None = None) -> tuple[Any, ...]:
        """The ``batch`` argument of a remembering script call (see Script.__call__): a
        fresh batch id unless given, the batch memory keys of ``keys``, the window."""
        batch_id = batch_id or _batch_id()
        return (batch_id, [keys.batches, keys.batches_old], self.retry_window)

    def _run_once(self, script: str, memory: BufferKeys, keys: list[str], args: list[Any]) -> Any:
        """Run a script that must not run twice under a fresh batch id (its reply kept in
        ``memory``'s batch keys), retrying after a lost connection."""
        batch = self._memory(memory)
        run = scripts.load(script)
        return retrying(lambda: run(self.client, keys, args, batch=batch), name=self.client)

    def _insert(
        self,
        blobs: list[bytes],
        priorities: np.ndarray,
        schema: dict[str, Any],
        options: dict[str, Any] | None = None,
    ) -> AddResult:
        """Store a batch in two calls: ``add_reserve`` checks it and reserves its ids, then
        one MULTI/EXEC writes the blobs with a native HSET and runs ``add_commit`` for the
        rest (priorities, order, eviction, the mass log). The blobs never pass through Lua, which
        took most of the server's time; readers see the whole batch or none of it, and a
        writer that dies before EXEC leaves nothing but a gap in the ids."""
        schema_json = schema_to_json(schema)
        self._check_schema(schema, schema_json)
        texts = [_priority_text(priority) for priority in priorities.tolist()]
        # one id for both calls (the commit's reply replaces the reservation's): a retry
        # after a lost reply gets the first reply back
        batch = self._memory(self.keys)
        large = bounds.add_refusal(len(blobs), sum(len(blob) for blob in blobs)) is not None
        store = self._insert_large if large else self._reserve_and_commit
        try:
            reply = store(blobs, texts, schema_json, options, batch)
        except SchemaError:
            raise self._schema_refusal(schema) from None
        except redis.exceptions.OutOfMemoryError as exc:
            raise self._full(exc) from exc
        refused = _refusal(reply)
        if refused is not None:
            return AddResult(np.arange(0, dtype=np.int64), 0, rejected=refused)
        if self._schema is None:
            self._schema, self._schema_json, self.kind = schema, schema_json, schema["kind"]
        first, count, evicted = (int(value) for value in reply)
        return AddResult(np.arange(first, first + count, dtype=np.int64), evicted)

    def _reserve_and_commit(
        self,
        blobs: list[bytes],
        texts: list[str],
        schema_json: str,
        options: dict[str, Any] | None,
        batch: tuple[str, list[str], float],
    ) -> list[Any]:
        """The two calls of an add within one add's bound (see ``_insert``): the commit's
        reply, or the reservation's refusal (``_refusal``)."""
        options_json = json.dumps(options) if options else ""
        reserve, commit = scripts.load("add_reserve"), scripts.load("add_commit").remembering
        # the commit script must be on the server before its transaction, whose HSET would
        # run even if the script was missing: with EVALSHA, SCRIPT EXISTS in the reserve's
        # round trip says; a function ran the reserve, so the library (commit included) is on
        exists = None if scripts.uses_functions(self.client) else ("SCRIPT", "EXISTS", commit.sha)
        reply = retrying(
            lambda: reserve(
                self.client,
                self.keys.all_keys(),
                [schema_json, len(blobs), options_json, *texts],
                batch=batch,
                then=exists,
            ),
            name=self.client,
        )
        if exists is not None:
            reply, loaded = reply
            if isinstance(loaded, Exception) or not loaded[0]:
                self.client.script_load(commit.source)
        if _refusal(reply) is not None:
            return list(reply)
        return self._commit(int(reply[0]), blobs, texts, schema_json, options_json, batch[0])

    def _insert_large(
        self,
        blobs: list[bytes],
        texts: list[str],
        schema_json: str,
        options: dict[str, Any] | None,
        batch: tuple[str, list[str], float],
    ) -> list[Any]:
        """A batch above one add's bound, staged, committed and stored a slice at a time
        (redisbuf/buffers/staged.py), atomically all the same; then the durability wait.
        The whole add's reply, or the commit's refusal."""
        reply = staged.insert_large(self.client, self.keys, blobs, texts, schema_json,
                                    dict(options or {}), batch)
        wait = durability_wait(self.durability, self.durability_timeout)
        if wait is not None and _refusal(reply) is None:
            confirmation = retrying(lambda: self.client.execute_command(*wait), name=self.client)
            check_durability(self.durability, confirmation, self.client)
        return reply

    def _commit(
        self,
        first: int,
        blobs: list[bytes],
        texts: list[str],
        schema_json: str,
        options_json: str,
        batch_id: str,
    ) -> list[Any]:
        """MULTI, HSET of the blobs under their reserved ids, ``add_commit``, EXEC
        (then the durability wait, on the same connection). Returns the script's reply.

        The script is loaded before (see ``_insert``); a missing script inside EXEC all the
        same (the server restarted or flushed its scripts in between: the HSET ran, the script
        did not) loads it and sends the whole transaction again, the HSET rewriting the
        same fields; until then readers could see those blobs in the items hash, but no
        item of them (ids are drawn from the other keys). After a lost
        connection the batch memory says whether the EXEC ran, so a retry neither stores
        the batch twice nor writes blobs back that eviction has removed since."""
        script = scripts.load("add_commit").remembering
        memory = [self.keys.batches, self.keys.batches_old]
        keys = [*self.keys.all_keys(), *memory]
        args = [schema_json, first, len(blobs), options_json, *texts, batch_id,
                int(self.retry_window * 1000)]
        fields: list[Any] = []
        for index, blob in enumerate(blobs):
            fields.append(format_id(first + index))
            fields.append(blob)
        wait = durability_wait(self.durability, self.durability_timeout)
        sent = [False]

        def attempt() -> list[Any]:
            if sent[0]:  # lost the reply: did the transaction run?
                done = scripts.read_remembered(self.client, memory, batch_id, "add_commit")
                if done is not None:
                    if wait is not None:
                        confirmation = self.client.execute_command(*wait)
                        check_durability(self.durability, confirmation, self.client)
                    return list(done)
            load = False
            while True:
                if load:
                    scripts.reload(self.client, script)
                pipe = self.client.pipeline(transaction=False)
                pipe.execute_command("MULTI")
                pipe.execute_command("HSET", self.keys.items, *fields)
                scripts.queue(pipe, self.client, script, keys, args)
                pipe.execute_command("EXEC")
                if wait is not None:
                    pipe.execute_command(*wait)
                sent[0] = True
                replies = pipe.execute(raise_on_error=False)
                executed = replies[3]
                if isinstance(executed, Exception):  # EXECABORT, OOM: nothing ran
                    refused = [r for r in replies[:3] if isinstance(r, Exception)]
                    self._release(first, len(blobs), batch_id, give_back=True)
                    raise (refused or [executed])[0]
                reply = executed[1]
                if scripts.missing(reply) and not load:
                    load = True
                    continue
                if isinstance(reply, redis.exceptions.ResponseError) and isinstance(
                        scripts.translate(reply), ApplyingError):
                    # a large add was committed since the reservation: the script
                    # refused before any write; store that add, then send this again
                    # (the HSET rewrites the same fields)
                    applying.finish(self.client, self.keys.meta)
                    continue
                if isinstance(reply, redis.exceptions.ResponseError):
                    # the script deleted the blobs and gave the ids back itself
                    self._release(first, len(blobs), batch_id, give_back=False)
                    raise scripts.translate(reply)
                if wait is not None:
                    check_durability(self.durability, replies[4], self.client)
                return list(reply)

        return retrying(attempt, name=self.client)

    def _full(self, refusal: redis.exceptions.OutOfMemoryError) -> ServerFullError:
        """The error for an add the server refused above ``maxmemory``."""
        if isinstance(refusal, ServerFullError):
            return refusal
        return ServerFullError(
            f"buffer {self.keys.name!r}: the server refused the add, its memory is above "
            "maxmemory and its policy evicts nothing (noeviction); nothing was written. "
            "Free memory (clear or drop a buffer) or raise maxmemory. The server said: "
            f"{refusal}"
        )

    def _release(self, first: int, n: int, batch_id: str, give_back: bool) -> None:
        """Undo a reservation whose commit the server refused (``lua/add_release.lua``),
        so that the refused batch leaves ``last_id`` and the batch memory as they were.
        Best effort: a server that cannot take even this leaves a gap in the ids and the
        reservation's entry, which is forgotten with its generation."""
        keys = [self.keys.meta, self.keys.items, self.keys.batches, self.keys.batches_old]
        args = [first, n, batch_id, int(give_back)]
        try:
            self._run("add_release", keys, args)
        except (redis.exceptions.RedisError, ServerUnavailableError):
            pass

    def _insert_with(self, schema: dict[str, Any], script: str, args: list[Any]) -> Any:
        """Run an inserting script (ARGV[1] = the schema, filled in here) after checking
        ``schema`` against the buffer's, and cache the schema it fixes. Returns its reply."""
        schema_json = schema_to_json(schema)
        self._check_schema(schema, schema_json)
        args[0] = schema_json
        # one id per batch: a retry after a lost reply gets the first run's reply back
        batch = self._memory(self.keys)
        run = scripts.load(script)
        wait = durability_wait(self.durability, self.durability_timeout)
        try:
            reply = retrying(
                lambda: run(self.client, self.keys.all_keys(), args, batch=batch, then=wait),
                name=self.client,
            )
            if wait is not None:
                reply, confirmation = reply
                check_durability(self.durability, confirmation, self.client)
        except SchemaError:
            raise self._schema_refusal(schema) from None
        except redis.exceptions.OutOfMemoryError as exc:
            raise self._full(exc) from exc
        if self._schema is None and _refusal(reply) is None:
            self._schema, self._schema_json, self.kind = schema, schema_json, schema["kind"]
        return reply
