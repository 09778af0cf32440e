"""Redis control backend: protocol messages through lists, liveness through heartbeats.

For processes that ``mpiexec`` did not start: the manager (``redisbuf manager NAME``) and
workers anywhere that reach the same Redis. All keys live under the buffer's hash tag:

=================================  ======  ==================================================
key                                type    content
=================================  ======  ==================================================
``rb:{name}:ctl:manager``          string  the running manager's session token, pid and host;
                                           expires ``heartbeat_ttl`` s after its last beat
``rb:{name}:ctl:req``              list    requests to the manager (msgpack envelopes:
                                           sender rank, tag, session token, message)
``rb:{name}:ctl:rep:{rank}:{tag}`` list    replies to worker ``rank`` on ``tag`` (0 = score,
                                           1 = metadata); expire an hour after the last one
``rb:{name}:ctl:hb:{rank}``        string  worker ``rank``'s heartbeat: the session token,
                                           its pid and host (expires like the manager's)
``rb:{name}:ctl:workers``          set     ranks of the workers that joined this session
``rb:{name}:ctl:procs``            hash    rank -> the worker's pid and host (this session)
``rb:{name}:ctl:ranks``            string  counter that hands out worker ranks 1, 2, ...
=================================  ======  ==================================================

A manager refuses to start while another one's key is alive, clears the request list and
the registry, then publishes its key; a worker waits (up to ``connect_timeout``) for that
key before its first request, so no request is lost to the clearing. Each side beats from
a background thread, so long computations do not look like death. A worker waiting for a
reply notices within about ``heartbeat_interval`` when the manager's key expires or
changes (restart) and raises :class:`~redisbuf.errors.ControlTimeoutError`; the manager
raises the same when a registered worker's heartbeat expires before its EXIT.

An expired heartbeat is only a suspicion: a process on a starved machine may not beat for
longer than the TTL. Each beat names its process (pid, host and pid namespace), and a
process on the same host and namespace as the one checking whose pid still runs (and is
no zombie) is late, not dead: it is waited for. The TTL alone decides for a process on
another host.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, cast

import redis as redis_lib

from ..errors import ControlTimeoutError, DecodeError, ProtocolError
from ..store.codec import packb, unpackb
from ..store.connection import as_client, reply_bytes
from ..store.keys import PREFIX, validate_name
from .protocol import ANY_SOURCE

log = logging.getLogger(__name__)

REPLY_TTL = 3600  # seconds a reply list outlives its last reply (a worker that vanished)
MANAGER_RANK = 0


@dataclass(frozen=True)
class ControlKeys:
    """Key names of the control plane of buffer ``name``."""

    name: str

    def __post_init__(self) -> None:
        validate_name(self.name)

    def _key(self, suffix: str) -> str:
        return f"{PREFIX}:{{{self.name}}}:ctl:{suffix}"

    @property
    def manager(self) -> str:
        return self._key("manager")

    @property
    def requests(self) -> str:
        return self._key("req")

    @property
    def workers(self) -> str:
        return self._key("workers")

    @property
    def ranks(self) -> str:
        return self._key("ranks")

    def reply(self, rank: int, tag: int) -> str:
        return self._key(f"rep:{rank}:{tag}")

    def heartbeat(self, rank: int) -> str:
        return self._key(f"hb:{rank}")

    @property
    def procs(self) -> str:
        return self._key("procs")


def _namespace() -> str:
    """This process's pid namespace (``pid:[N]``; "" where /proc does not say)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def this_process() -> bytes:
    """How a heartbeat names its process: ``pid=P host=H ns=NS``."""
    return b"pid=%d host=%s ns=%s" % (os.getpid(), socket.gethostname().encode(),
                                      _namespace().encode())


def runs_here(described: bytes | None) -> bool:
    """Whether the process a heartbeat value (or a ``procs`` entry) names is on this host,
    in this pid namespace, and still runs (not a zombie): then an expired heartbeat of it
    means a late beat (a starved process), not a death. False when it cannot tell."""
    if not described:
        return False
    fields = dict(part.split(b"=", 1) for part in described.split() if b"=" in part)
    try:
        pid = int(fields.get(b"pid", b""))
    except ValueError:
        return False
    if fields.get(b"host") != socket.gethostname().encode() or \
            fields.get(b"ns", b"").decode() != _namespace():
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc here: whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except OSError:
            return True
        return True


class _Heartbeat:
    """A daemon thread that keeps ``key`` alive with ``value`` until stopped."""

    def __init__(self, client: Any, key: str, value: bytes, interval: float, ttl: float) -> None:
        self.client, self.key, self.value = client, key, value
        self.interval, self.ttl_ms = interval, max(1, int(ttl * 1000))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat {key}", daemon=True)

    def beat(self) -> None:
        self.client.set(self.key, self.value, px=self.ttl_ms)

    def start(self) -> None:
        self.beat()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.beat()
            except (redis_lib.exceptions.RedisError, OSError) as exc:
                # the main thread sees the same server trouble and reports it
                log.debug("heartbeat %s failed: %s", self.key, exc)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval + 1)


def _token_of(value: bytes | None) -> bytes | None:
    return value.split(b" ", 1)[0] if value else None


class _RedisEndpoint:
    def __init__(
        self, client: Any, name: str, heartbeat_interval: float, heartbeat_ttl: float
    ) -> None:
        if heartbeat_interval <= 0 or heartbeat_ttl <= heartbeat_interval:
            raise ValueError("need 0 < heartbeat_interval < heartbeat_ttl")
        self.client = as_client(client)
        self.keys = ControlKeys(name)
        self.name = name
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_ttl = heartbeat_ttl
        self._heartbeat: _Heartbeat | None = None

    def _brpop(self, key: str, timeout: float) -> bytes | None:
        # BRPOP takes seconds with millisecond resolution; 0 would mean "forever"
        reply = self.client.brpop([key], timeout=max(timeout, 0.001))
        return None if reply is None else reply_bytes(reply[1])


class RedisManagerTransport(_RedisEndpoint):
    """The manager's end of the Redis control plane of buffer ``name``."""

    def __init__(
        self,
        client: Any,
        name: str,
        rank: int = MANAGER_RANK,
        heartbeat_interval: float = 1.0,
        heartbeat_ttl: float = 5.0,
    ) -> None:
        super().__init__(client, name, heartbeat_interval, heartbeat_ttl)
        self._rank = rank
        self.token = secrets.token_hex(8).encode()
        self.started = False

    @property
    def rank(self) -> int:
        return self._rank

    def start(self) -> None:
        """Claim the manager key; raise :class:`ProtocolError` if another manager runs."""
        if self.started:
            return
        k = self.keys
        holder = reply_bytes(self.client.get(k.manager))
        if holder is not None:
            raise ProtocolError(
                f"a manager is already running for buffer {self.name!r} "
                f"({k.manager} = {holder.decode(errors='replace')})"
            )
        # clear the previous session before announcing this one: workers wait for the key
        self.client.delete(k.requests, k.workers, k.ranks, k.procs)
        value = b"%s %s" % (self.token, this_process())
        if not self.client.set(k.manager, value, nx=True, px=int(self.heartbeat_ttl * 1000)):
            raise ProtocolError(f"another manager for buffer {self.name!r} started just now")
        self._heartbeat = _Heartbeat(
            self.client, k.manager, value, self.heartbeat_interval, self.heartbeat_ttl
        )
        self._heartbeat.start()
        self.started = True

    def send(self, dest: int, tag: int, payload: bytes) -> None:
        key = self.keys.reply(dest, tag)
        pipe = self.client.pipeline(transaction=False)
        pipe.lpush(key, payload)
        pipe.expire(key, REPLY_TTL)
        pipe.execute()

    def recv(self, source: int, tag: int, timeout: float | None = None) -> tuple[int, bytes]:
        self.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = self.heartbeat_interval if deadline is None else deadline - time.monotonic()
            raw = self._brpop(self.keys.requests, min(left, self.heartbeat_interval))
            if raw is not None:
                try:
                    envelope = unpackb(raw)
                    sender, msg_tag = int(envelope["src"]), int(envelope["tag"])
                    session, body = envelope["session"], envelope["body"]
                except (DecodeError, KeyError, TypeError, ValueError) as exc:
                    # one stray push must not stop the manager every worker depends on
                    log.warning("dropped a malformed request in %s: %s", self.keys.requests, exc)
                else:
                    if session != self.token:
                        log.warning("dropped a request of rank %d from an earlier session", sender)
                    elif (source in (ANY_SOURCE, sender)) and msg_tag == tag:
                        return sender, body
                    else:
                        log.warning("dropped a request of rank %d on tag %d", sender, msg_tag)
            if deadline is not None and time.monotonic() >= deadline:
                raise ControlTimeoutError(
                    f"no request for buffer {self.name!r}'s manager within {timeout:.1f} s"
                )

    def registered(self) -> set[int]:
        """Ranks of the workers that joined this session."""
        return {int(r) for r in self.client.smembers(self.keys.workers)}

    def check_peers(self, done: set[int]) -> None:
        """Raise :class:`ControlTimeoutError` naming every joined worker, not in ``done``,
        whose heartbeat has expired."""
        ranks = sorted(self.registered() - done)
        if not ranks:
            return
        pipe = self.client.pipeline(transaction=False)
        for rank in ranks:
            pipe.exists(self.keys.heartbeat(rank))
        dead = {rank for rank, alive in zip(ranks, pipe.execute(), strict=True) if not alive}
        if dead:
            # a worker whose process still runs on this host is late (starved), not dead
            described = self.client.hmget(self.keys.procs, *sorted(dead))
            dead -= {rank for rank, proc in zip(sorted(dead), described, strict=True)
                     if runs_here(reply_bytes(proc))}
        if dead:
            # a worker pushes its EXIT before dropping its heartbeat: a rank with a request
            # still queued is not lost, its EXIT (or last request) is about to be read
            for raw in self.client.lrange(self.keys.requests, 0, -1):
                try:
                    dead.discard(int(unpackb(cast(bytes, raw))["src"]))
                except (DecodeError, KeyError, TypeError, ValueError):
                    continue
        if dead:
            raise ControlTimeoutError(
                f"worker rank(s) {sorted(dead)} of buffer {self.name!r} stopped without EXIT "
                f"(no heartbeat for {self.heartbeat_ttl:.1f} s, and no such process runs "
                "on this host)"
            )

    def close(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None
        if self.started:
            self.started = False
            try:
                if _token_of(reply_bytes(self.client.get(self.keys.manager))) == self.token:
                    self.client.delete(self.keys.manager)
            except (redis_lib.exceptions.RedisError, OSError):
                pass


class RedisWorkerTransport(_RedisEndpoint):
    """A worker's end of the Redis control plane of buffer ``name``.

    ``rank`` must be unique among the manager's workers; ``None`` takes the next free one
    from the manager's session (1, 2, ...) when the worker first connects. Connecting waits
    up to ``connect_timeout`` s for a running manager. A reply wait raises
    :class:`ControlTimeoutError` after ``reply_timeout`` s (``None``: as long as the
    manager is alive), or as soon as the manager's heartbeat stops.
    """

    def __init__(
        self,
        client: Any,
        name: str,
        rank: int | None = None,
        connect_timeout: float = 60.0,
        reply_timeout: float | None = None,
        heartbeat_interval: float = 1.0,
        heartbeat_ttl: float = 5.0,
    ) -> None:
        super().__init__(client, name, heartbeat_interval, heartbeat_ttl)
        if rank is not None and rank == MANAGER_RANK:
            raise ValueError(f"rank {MANAGER_RANK} is the manager's")
        self._rank = rank
        self.connect_timeout = connect_timeout
        self.reply_timeout = reply_timeout
        self.token: bytes | None = None
        self._manager_process: bytes | None = None  # pid, host and ns its key named

    @property
    def rank(self) -> int:
        self.connect()
        assert self._rank is not None
        return self._rank

    def connect(self) -> None:
        """Wait for the manager, take a rank, register and start beating (once)."""
        if self.token is not None:
            return
        k = self.keys
        deadline = time.monotonic() + self.connect_timeout
        while True:
            value = reply_bytes(self.client.get(k.manager))
            token = _token_of(value)
            if token is not None and value is not None:
                self._manager_process = value.split(b" ", 1)[1] if b" " in value else None
                break
            if time.monotonic() >= deadline:
                raise ControlTimeoutError(
                    f"no manager is running for buffer {self.name!r}: {k.manager} did not "
                    f"appear within {self.connect_timeout:.1f} s (start `redisbuf manager "
                    f"{self.name}`)"
                )
            time.sleep(0.05)
        if self._rank is None:
            self._rank = int(self.client.incr(k.ranks))
        rank = self._rank
        self.client.delete(k.reply(rank, 0), k.reply(rank, 1))  # stale replies of a past run
        # beat before joining, so the manager never sees a joined rank without a heartbeat
        me = this_process()
        self._heartbeat = _Heartbeat(
            self.client, k.heartbeat(rank), b"%s %s" % (token, me), self.heartbeat_interval,
            self.heartbeat_ttl
        )
        self._heartbeat.start()
        self.client.hset(k.procs, rank, me)
        self.client.sadd(k.workers, rank)
        self.token = token

    def send(self, dest: int, tag: int, payload: bytes) -> None:
        self.connect()
        envelope = packb({"src": self._rank, "tag": tag, "session": self.token, "body": payload})
        self.client.lpush(self.keys.requests, envelope)

    def _manager_alive(self) -> bool:
        """Whether this session's manager runs: its key holds this session's token, or it
        expired while the manager's process still runs on this host (a late beat)."""
        value = reply_bytes(self.client.get(self.keys.manager))
        if value is None:
            return runs_here(self._manager_process)
        return _token_of(value) == self.token

    def recv(self, source: int, tag: int, timeout: float | None = None) -> tuple[int, bytes]:
        self.connect()
        timeout = self.reply_timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        key = self.keys.reply(self.rank, tag)
        while True:
            left = self.heartbeat_interval if deadline is None else deadline - time.monotonic()
            raw = self._brpop(key, max(0.0, min(left, self.heartbeat_interval)))
            if raw is not None:
                return MANAGER_RANK if source == ANY_SOURCE else source, raw
            if not self._manager_alive():
                raise ControlTimeoutError(
                    f"the manager of buffer {self.name!r} stopped (its heartbeat "
                    f"{self.keys.manager} expired or changed) while rank {self._rank} "
                    f"waited for a reply on tag {tag}"
                )
            if deadline is not None and time.monotonic() >= deadline:
                raise ControlTimeoutError(
                    f"no reply from the manager of buffer {self.name!r} on tag {tag} "
                    f"within {timeout:.1f} s"
                )

    def check_peers(self, done: set[int]) -> None:
        if self.token is not None and not self._manager_alive():
            raise ControlTimeoutError(f"the manager of buffer {self.name!r} is not running")

    def close(self) -> None:
        """Stop beating and remove this worker's heartbeat. Send EXIT first: a worker
        that closes without EXIT is reported as lost by the manager."""
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None
            assert self._rank is not None  # a worker beats once it has a rank
            try:
                self.client.delete(self.keys.heartbeat(self._rank))
            except (redis_lib.exceptions.RedisError, OSError):
                pass
