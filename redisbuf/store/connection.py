"""Connecting to Redis with bounded timeouts and errors that name the server."""

from __future__ import annotations

import os
import re
import threading
import time
import urllib.parse
import warnings
from typing import Any, cast

import redis
import redis.cluster
from hiredis import pack_command
from redis.connection import (
    HIREDIS_AVAILABLE,
    Encoder,
    HiredisRespSerializer,
    PythonRespSerializer,
)

from ..errors import DurabilityError, ServerConfigError, ServerUnavailableError
from ..servers.embedded import URL_ENV, default_url

__all__ = [
    "CLUSTER_SCHEMES",
    "URL_ENV",
    "RespPacker",
    "as_client",
    "connect",
    "default_url",
    "is_cluster",
    "redacted",
]


class RespPacker:
    """Packs large commands into one RESP bytes object with a single join.

    redis-py's default packers copy large commands several times (hiredis' packer runs
    at about 0.5 GB/s here); an ``add`` of 256 items of 4 KiB is one 1 MiB command, so
    the copy cost is most of the client's time. Small commands, where the per-argument
    Python loop would cost more than it saves, go to redis-py's own packer. Arguments are
    encoded as redis-py does: bytes as they are, str as UTF-8, int and float via ``repr``.
    """

    LARGE = 64 * 1024

    def __init__(self) -> None:
        self._small = (
            HiredisRespSerializer()
            if HIREDIS_AVAILABLE
            else PythonRespSerializer(6000, Encoder("utf-8", "strict", False).encode)
        )
        self._direct = pack_command if HIREDIS_AVAILABLE else None

    def pack(self, *args: Any) -> list[bytes]:
        if isinstance(args[0], str):  # a command of two words given as one ("CLIENT ID")
            args = (*args[0].encode().split(), *args[1:])
        size = 0
        views = False  # redis-py's packer turns bytearrays and memoryviews into bytes
        for arg in args:
            if type(arg) is bytes:
                size += len(arg)
            elif isinstance(arg, (bytearray, memoryview)):
                size += len(arg)
                views = True
        if size < self.LARGE:
            if views or self._direct is None:
                return self._small.pack(*args)
            # hiredis directly, as redis-py's packer does once its own pass over the
            # arguments finds nothing to convert: a command of many small arguments (an
            # HMGET of a batch's ids) costs one pass, not two
            if b" " in args[0]:
                args = (*args[0].split(), *args[1:])
            try:
                return [self._direct(args)]
            except TypeError:  # what redis-py's packer raises for it
                return self._small.pack(*args)
        parts: list[Any] = [b"*%d\r\n" % len(args)]
        append = parts.append
        for arg in args:
            if isinstance(arg, str):
                arg = arg.encode()
            elif isinstance(arg, bool):
                raise redis.exceptions.DataError(f"invalid input of type bool: {arg!r}")
            elif isinstance(arg, (int, float)):
                arg = repr(arg).encode()
            elif not isinstance(arg, (bytes, memoryview, bytearray)):
                raise redis.exceptions.DataError(
                    f"invalid input of type {type(arg).__name__}: {arg!r}"
                )
            append(b"$%d\r\n" % len(arg))
            append(arg)
            append(b"\r\n")
        return [b"".join(parts)]


_QUERY_SECRET = re.compile(r"([?&](?:password|pass|pwd)=)[^&]*", re.IGNORECASE)
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")


def _secrets(url: str) -> list[str]:
    """The password parts of ``url``: after the first ``:`` of the user info (up to the
    last ``@``, so unencoded ``# / ? @`` in it count) and any ``password=`` query value."""
    found = [m.group(0).split("=", 1)[1] for m in _QUERY_SECRET.finditer(url)]
    scheme = _SCHEME.match(url)
    rest = _QUERY_SECRET.sub("", url)[scheme.end() if scheme else 0 :]
    userinfo = rest[: rest.rfind("@")] if "@" in rest else ""
    if ":" in userinfo:
        found.append(userinfo.split(":", 1)[1])
    return [secret for secret in found if secret]


def redacted(url: str) -> str:
    """``url`` with every password replaced by ``***``, for error messages and logs:
    the user info's (encoded or not: an unencoded ``#``, ``/``, ``?`` or ``@`` in it does
    not end it early) and a ``password=`` query parameter's."""
    url = _QUERY_SECRET.sub(r"\1***", url)
    scheme = _SCHEME.match(url)
    head = url[: scheme.end()] if scheme else ""
    rest = url[len(head) :]
    at = rest.rfind("@")
    if at >= 0 and ":" in rest[:at]:
        user = rest[:at].split(":", 1)[0]
        rest = f"{user}:***{rest[at:]}"
    return head + rest


def scrub(text: str, url: str) -> str:
    """``text`` (an error message about ``url``) with the URL redacted and any piece of
    its password removed: a URL with an unencoded ``#`` or ``/`` in the password is
    misparsed, and the pieces turn up as host or port in the client's messages."""
    text = text.replace(url, redacted(url))
    for secret in _secrets(url):
        text = text.replace(secret, "***")
        for piece in re.split(r"[#/?@:&]", secret):
            if piece:
                text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(piece)}(?![A-Za-z0-9])", "***", text)
    return text


#: URL schemes that ask for a Redis Cluster client (``rediss+cluster`` with TLS).
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


class _OneSend:
    """Sends a pipeline's packed pieces with one ``sendall``.

    redis-py sends each piece over 6,000 bytes by itself, and each ``sendall`` gives up
    the GIL and waits to take it back, behind whatever thread of the process is busy (a
    learner's, an actor's): a step writer's insert of 4 KiB steps, a MULTI with one large
    HSET and a large FCALL among small commands, took 2-3 ms to send beside a busy
    thread. One joined piece costs a copy (~0.1 ms per MiB) and one wait."""

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if isinstance(command, list) and len(command) > 1:
            command = [b"".join(command)]
        super().send_packed_command(command, check_health)  # type: ignore[misc]


class OneSendConnection(_OneSend, redis.connection.Connection):
    """A TCP connection of :class:`_OneSend`."""


class OneSendUnixConnection(_OneSend, redis.connection.UnixDomainSocketConnection):
    """A Unix-socket connection of :class:`_OneSend`."""


class PackingConnection(OneSendConnection):
    """A connection that packs commands with :class:`RespPacker` (for cluster clients,
    which build their connections themselves and do not pass ``command_packer`` on)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("command_packer", RespPacker())
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]  # redis-py's


class PackingSSLConnection(_OneSend, redis.connection.SSLConnection):
    """:class:`PackingConnection` over TLS."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("command_packer", RespPacker())
        super().__init__(*args, **kwargs)


def _connection_class(url: str) -> type:
    """The :class:`_OneSend` connection for ``url``'s scheme (redis-py's choice; the
    scheme read as redis-py reads it, case aside)."""
    scheme = urllib.parse.urlparse(url).scheme
    if scheme == "unix":
        return OneSendUnixConnection
    return PackingSSLConnection if scheme == "rediss" else OneSendConnection


class _Held:
    """A connection one thread keeps between its commands (:class:`HeldRedis`), given back
    to its pool when that thread's ``threading.local`` lets it go (the thread ended, or
    a command failed on it)."""

    __slots__ = ("conn", "pid", "pool")

    def __init__(self, pool: Any, conn: Any) -> None:
        self.pool, self.conn, self.pid = pool, conn, os.getpid()

    def __del__(self) -> None:
        try:
            self.pool.release(self.conn)
        except Exception:  # noqa: BLE001, S110 - a pool closed or gone at exit: nothing to give back
            pass


class HeldRedis(redis.Redis):
    """A ``redis.Redis`` whose commands each thread sends on a connection it keeps
    between them, rather than taking one from the pool and giving it back for every
    command (redis-py's bookkeeping around that cost ~40-45 us of client CPU a command:
    a PING measured ~80 us through the pool, ~35-40 us here). As the pool does before
    lending a connection, one that has data waiting or was closed is connected again
    first; a command that fails other than with an error reply lets its connection go
    (disconnected, back to the pool) and raises as redis-py does. Pipelines, pub/sub
    and transactions take connections from the pool as ever; a forked process takes
    its own."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._held = threading.local()

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if self.connection is not None:  # a single-connection client: redis-py's path
            return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]  # redis-py's
        held = getattr(self._held, "value", None)
        if held is None or held.pid != os.getpid():
            held = self._held.value = _Held(self.connection_pool,
                                            self.connection_pool.get_connection())
        conn = held.conn
        try:
            if conn.can_read():  # data left over, or closed by the server: start afresh
                raise redis.exceptions.ConnectionError("connection has data")
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
            conn.disconnect()
            conn.connect()
        try:
            return self._send_command_parse_response(conn, args[0], *args, **options)  # type: ignore[no-untyped-call]
        except redis.exceptions.ResponseError:
            raise
        except BaseException:
            # disconnected before it goes back to the pool (dropping the holder gives it
            # back), so that no other thread is lent it still open mid-reply
            conn.disconnect()
            self._held.value = None
            raise


def _cluster_url(url: str) -> tuple[str, bool]:
    """(``url`` with a ``redis+cluster`` / ``rediss+cluster`` scheme turned into the plain
    one, whether it had such a scheme)."""
    scheme, sep, rest = url.partition("://")
    plain = CLUSTER_SCHEMES.get(scheme.lower()) if sep else None
    return (f"{plain}://{rest}", True) if plain else (url, False)


def _cluster_enabled(probe: redis.Redis) -> bool:
    """Whether the server ``probe`` talks to is a Redis Cluster node (INFO cluster); False
    when it does not say (an ACL without INFO, fakeredis, an old server)."""
    try:
        return str(probe.info("cluster").get("cluster_enabled", 0)) == "1"
    except redis.exceptions.ResponseError:
        return False


def _cluster_db(url: str) -> None:
    """Refuse a cluster URL naming a database other than 0 (a cluster has only that)."""
    db = redis.connection.parse_url(url).get("db", 0)
    if db not in (0, None):
        raise ValueError(f"Redis Cluster has only database 0, the URL names database {db}")


def _cluster_client(
    url: str, connect_timeout: float, socket_timeout: float | None
) -> redis.cluster.RedisCluster:
    """A RedisCluster client for the cluster that the node at ``url`` belongs to."""
    _cluster_db(url)
    tls = url.lower().startswith("rediss://")
    for attempt in range(3):
        try:
            return redis.cluster.RedisCluster.from_url(
                url,
                socket_connect_timeout=connect_timeout,
                socket_timeout=socket_timeout,
                decode_responses=False,
                retry_on_timeout=False,
                connection_class=PackingSSLConnection if tls else PackingConnection,
            )
        except redis.exceptions.ConnectionError:
            # the client's first keyless command (COMMAND, which its command parser reads
            # when made) goes to the node of the URL; after a connection error or timeout
            # there (a busy machine) redis-py retries on a random master, which may be one
            # that is down: a new client starts again from the node of the URL
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def connect(
    url: str | None = None, *, connect_timeout: float = 5.0, socket_timeout: float | None = 60.0
) -> Any:
    """A Redis client for ``url`` (or ``$REDISBUF_URL``, else the private server of
    :func:`redisbuf.servers.embedded.default_url`), checked with PING.

    A URL with the scheme ``redis+cluster://`` (``rediss+cluster://`` with TLS) names one
    node of a Redis Cluster; a plain ``redis://`` URL whose server reports
    ``cluster_enabled:1`` (INFO cluster) is taken as one too. Either gives a
    ``redis.cluster.RedisCluster`` client, which discovers the other nodes and sends each
    command to the master of its keys' slot.

    Raises :class:`ServerUnavailableError` naming the URL when the server cannot be
    reached within ``connect_timeout`` seconds.

    Args:
        url: a ``redis://``, ``rediss://``, ``redis+cluster://`` or
            ``rediss+cluster://`` URL, or ``None``.
        connect_timeout: seconds to wait for the connection and the PING.
        socket_timeout: seconds to wait for any later reply (``None``: no limit).

    Returns:
        A ``redis.Redis`` or ``redis.cluster.RedisCluster`` client
        (``decode_responses=False``).

    Raises:
        ServerUnavailableError: the server cannot be reached, the URL is invalid, or the
            server does not speak the Redis protocol.

    Examples:
        >>> from redisbuf import connect
        >>> from redisbuf.errors import ServerUnavailableError
        >>> try:
        ...     connect("redis://127.0.0.1:1", connect_timeout=0.5)  # nothing listens there
        ... except ServerUnavailableError as error:
        ...     print(str(error)[:40])
        cannot reach Redis at redis://127.0.0.1:
    """
    url = url or default_url()
    given = url
    try:
        url, cluster = _cluster_url(url)
        if cluster:
            _cluster_db(url)
        # probe with the short timeout: a port that accepts and never answers must not
        # hold us for the long socket timeout
        for delay in (*RETRY_DELAYS, None):
            try:
                with redis.Redis.from_url(
                    url, socket_connect_timeout=connect_timeout, socket_timeout=connect_timeout
                ) as probe:
                    probe.ping()
                    cluster = cluster or _cluster_enabled(probe)
                break
            except redis.exceptions.ConnectionError as exc:
                # a server that answered, then dropped the connection, may answer the
                # next one; refused or silent ones fail at once
                if delay is None or "closed" not in str(exc) and "reset" not in str(exc):
                    raise
                time.sleep(delay)
        client: Any
        if cluster:
            client = _cluster_client(url, connect_timeout, socket_timeout)
        else:
            client = HeldRedis.from_url(
                url,
                socket_connect_timeout=connect_timeout,
                socket_timeout=socket_timeout,
                decode_responses=False,
                retry_on_timeout=False,
                command_packer=RespPacker(),
                connection_class=_connection_class(url),
            )
        client.redisbuf_url = redacted(given)  # for messages
    except (ValueError, TypeError) as exc:  # TypeError: an unknown query option
        hint = " (percent-encode # / ? @ in a password)" if _secrets(url) else ""
        raise ServerUnavailableError(
            f"invalid Redis URL {redacted(given)}: {scrub(str(exc), given)}{hint}"
        ) from None
    except redis.exceptions.InvalidResponse as exc:
        # e.g. an HTTP server on the port: redis-py says 'Protocol error, got "H"'
        raise ServerUnavailableError(
            f"the server at {redacted(given)} does not speak the Redis protocol (is it a "
            f"Redis server? its first reply was not RESP: {scrub(str(exc), given)})"
        ) from None
    except redis.exceptions.ResponseError as exc:
        if "cluster mode" not in str(exc):
            raise ServerUnavailableError(
                f"cannot reach Redis at {redacted(given)}: {scrub(str(exc), given)}"
            ) from None
        raise ServerUnavailableError(
            f"the server at {redacted(given)} is a Redis Cluster node, and a cluster has "
            f"only database 0: drop the database from the URL ({scrub(str(exc), given)})"
        ) from None
    except (redis.exceptions.RedisError, OSError) as exc:
        raise ServerUnavailableError(
            f"cannot reach Redis at {redacted(given)}: {scrub(str(exc), given)}"
        ) from None
    return client


def is_cluster(client: Any) -> bool:
    """Whether ``client`` (possibly :class:`Guarded`) is a Redis Cluster client."""
    client = getattr(client, "unwrapped", client)
    return isinstance(client, redis.cluster.RedisCluster)


def reply_bytes(value: Any) -> bytes | None:
    """A reply of one of redisbuf's clients as the bytes (or None) it is: they never decode
    responses (:func:`as_client` refuses a client that does), while redis-py's types say
    ``bytes | str`` for either setting."""
    return cast("bytes | None", value)


def as_client(redis_or_url: Any) -> redis.Redis:
    """Accept a client or a URL; refuse clients that decode responses (blobs are bytes)."""
    if redis_or_url is None or isinstance(redis_or_url, str):
        return connect(redis_or_url)
    kwargs = getattr(getattr(redis_or_url, "connection_pool", None), "connection_kwargs", {})
    if is_cluster(redis_or_url):
        kwargs = redis_or_url.nodes_manager.connection_kwargs
    if kwargs.get("decode_responses"):
        raise ValueError("redisbuf needs a Redis client created with decode_responses=False")
    return redis_or_url


class SlotClient:
    """The client of the master that serves one slot of a Redis Cluster, for everything
    a buffer does there (all of a buffer's keys share one slot).

    Through it a buffer's pipelines, MULTI/EXEC and SCRIPT commands go to that master as
    on a single server (a cluster client refuses MULTI and keyless commands in
    pipelines, and routes each pipelined command on its own). When the slot has moved
    (a MOVED reply: resharding, a failover) the cluster's slot map is read again and the
    call, which did not run, is sent once more to the master now serving the slot. When
    the master is lost, the slot map is read again for the calls that follow and the
    error stands (the call may have run); a pipeline's too. A pipeline is bound to the
    master of the moment it is made."""

    def __init__(self, cluster: Any, key: str) -> None:
        self.cluster = cluster
        self.key = key  # messages name the node (server_name), not the URL given
        self._bind()

    def _bind(self) -> None:
        self.node = self.cluster.get_node_from_key(self.key)
        self._client = self.cluster.get_redis_connection(self.node)

    def _rebind(self) -> bool:
        """Read the slot map again; whether the slot is now served by another node."""
        before = self.node.name
        try:
            self.cluster.nodes_manager.initialize()
            self._bind()
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException,
                OSError):
            return False
        return self.node.name != before

    @property
    def connection_pool(self) -> Any:
        return self._client.connection_pool

    def pipeline(self, *args: Any, **kwargs: Any) -> _SlotPipeline:
        return _SlotPipeline(self, self._client.pipeline(*args, **kwargs))

    def __getattr__(self, attribute: str) -> Any:
        value = getattr(self._client, attribute)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return value(*args, **kwargs)
            except redis.exceptions.MovedError:
                # refused unexecuted: safe to send again where the slot is now
                if not self._rebind():
                    raise
                return getattr(self._client, attribute)(*args, **kwargs)
            except LOST:
                # the call may have run before the master was lost: only later calls
                # (and the caller's own retries of what is safe to repeat) go to the
                # master now serving the slot
                self._rebind()
                raise

        return call

    def close(self) -> None:
        """Close the cluster client (its node clients with it)."""
        self.cluster.close()

    def __repr__(self) -> str:
        return f"SlotClient({self.key!r} at {self.node.name})"


class _SlotPipeline:
    """A pipeline of a :class:`SlotClient`'s master: when that master is lost during
    ``execute``, the slot map is read again for the calls that follow (a sampler's
    commit is a pipeline: without this it kept calling a dead master after a failover)
    and the error stands."""

    def __init__(self, owner: SlotClient, pipe: Any) -> None:
        self._owner, self._pipe = owner, pipe

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._pipe, attribute)

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._pipe.execute(*args, **kwargs)
        except LOST:
            self._owner._rebind()
            raise

    def __enter__(self) -> _SlotPipeline:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._pipe.reset()


def slot_client(client: Any, key: str) -> Any:
    """For a cluster client, a :class:`SlotClient` for the slot of ``key``; any other
    client as it is."""
    if not is_cluster(client):
        return client
    return SlotClient(getattr(client, "unwrapped", client), key)


# What a lost server looks like to redis-py: refused, reset, or silent past the timeout.
LOST = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


def server_name(client: Any) -> str:
    """The server of ``client`` as a URL without password, for error messages."""
    given = getattr(client, "redisbuf_url", None)
    if given:
        return str(given)
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", {})
    if kwargs.get("path"):
        return f"unix://{kwargs['path']}"
    host, port = kwargs.get("host"), kwargs.get("port")
    if host is None:
        return f"the server of {type(client).__name__}"
    scheme = "rediss" if "SSL" in getattr(pool, "connection_class", type).__name__ else "redis"
    return f"{scheme}://{host}:{port}/{kwargs.get('db', 0)}"


def unavailable(client: Any, exc: BaseException) -> ServerUnavailableError:
    """The ServerUnavailableError for ``exc`` (a LOST error) raised talking to ``client``."""
    where = server_name(client)
    return ServerUnavailableError(f"lost the Redis server at {where}: {exc}")


# Retries of calls that are safe to repeat, after the server was lost: delays in seconds.
RETRY_DELAYS = (0.05, 0.1, 0.2, 0.4, 0.8)

# Commands (redis-py method names and RESP names) that only read: retried when lost.
READ_METHODS = frozenset(
    "get hget hmget hgetall hlen hexists zcard zrange zrevrange zrangebyscore zmscore "
    "zscore zcount exists type memory_usage info config_get ping lrange llen dbsize".split()
)
READ_COMMANDS = frozenset(
    "GET HGET HMGET HGETALL HLEN HEXISTS ZCARD ZRANGE ZREVRANGE ZRANGEBYSCORE ZMSCORE ZSCORE "
    "ZCOUNT EXISTS TYPE INFO PING LRANGE LLEN DBSIZE".split()
)


def retrying(call: Any, *, name: Any = None, delays: tuple[float, ...] = RETRY_DELAYS) -> Any:
    """``call()``, repeated after each delay while it raises a lost-server error
    (:class:`ServerUnavailableError` or redis-py's); only for calls safe to repeat."""
    for delay in (*delays, None):
        try:
            return call()
        except ServerUnavailableError:
            if delay is None:
                raise
        except LOST as exc:
            if delay is None:
                raise unavailable(name, exc) from None
        time.sleep(delay)
    raise AssertionError("unreachable")


class Guarded:
    """A Redis client (or pipeline) whose calls raise :class:`ServerUnavailableError`
    naming the server, instead of redis-py's ConnectionError / TimeoutError, when the
    server is lost. Read-only commands (and pipelines of them) are first retried after
    each of ``RETRY_DELAYS``. Everything else is the wrapped object's own behaviour;
    ``pipeline()`` returns a guarded pipeline."""

    def __init__(self, client: Any, name: Any = None) -> None:
        self._client = client
        self._name = name if name is not None else client
        self._stack: list[Any] = []

    @property
    def unwrapped(self) -> Any:
        return self._client

    def __getattr__(self, attribute: str) -> Any:
        value = getattr(self._client, attribute)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                result = value(*args, **kwargs)
            except LOST as exc:
                if not self._repeatable(attribute):
                    raise unavailable(self._name, exc) from None
                result = retrying(lambda: self._again(attribute, args, kwargs), name=self._name)
            if attribute == "pipeline":
                return Guarded(result, self._name)
            return result

        if attribute == "execute":  # a pipeline: keep its commands for a retry
            self._stack = list(getattr(self._client, "command_stack", []))
        return call

    def _repeatable(self, attribute: str) -> bool:
        if attribute == "execute":
            return bool(self._stack) and all(
                str(args[0]).upper() in READ_COMMANDS for args, _options in self._stack
            )
        return attribute in READ_METHODS

    def _again(self, attribute: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if attribute == "execute":
            self._client.command_stack = list(self._stack)  # execute() emptied it
        return getattr(self._client, attribute)(*args, **kwargs)

    def __enter__(self) -> Any:
        self._client.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> Any:
        return self._client.__exit__(*exc_info)

    def __repr__(self) -> str:
        return f"Guarded({self._client!r})"


def guarded(client: Any) -> Any:
    """``client`` wrapped in :class:`Guarded` (once)."""
    return client if isinstance(client, Guarded) else Guarded(client)


# Policies under which Redis never evicts a buffer's keys (they carry no TTL).
SAFE_POLICIES = ("noeviction", "volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl")


def eviction_policy(client: Any) -> str | None:
    """The server's ``maxmemory-policy`` (from INFO memory, then CONFIG GET), or None when
    the server does not say (an ACL without INFO and CONFIG, fakeredis)."""
    try:
        policy = client.info("memory").get("maxmemory_policy")
        if policy:
            return str(policy)
    except redis.exceptions.ResponseError:
        pass
    try:
        found = client.config_get("maxmemory-policy").get("maxmemory-policy")
    except redis.exceptions.ResponseError:
        return None
    return found.decode() if isinstance(found, bytes) else found


def check_eviction_policy(client: Any, strict: bool = False) -> None:
    """Warn (``strict``: raise :class:`ServerConfigError`) when the server may evict
    keys without a TTL (``allkeys-*``): it would delete a buffer's meta, order or tree
    keys under memory pressure and the buffer would vanish or break."""
    policy = eviction_policy(client)
    if policy is None or policy in SAFE_POLICIES:
        return
    message = (
        f"Redis at {server_name(client)} has maxmemory-policy {policy}: at maxmemory it "
        "deletes any key, a buffer's included. Use noeviction (or a volatile-* policy): "
        "CONFIG SET maxmemory-policy noeviction"
    )
    if strict:
        raise ServerConfigError(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


DURABILITY = (None, "aof", "replica")


def check_durability_support(client: Any, durability: str | None, timeout: float) -> None:
    """Raise :class:`ServerConfigError` unless the server can confirm ``durability``:
    ``"aof"`` needs WAITAOF (Redis >= 7.2, valkey) and ``appendonly yes``; ``"replica"``
    needs a connected replica. ``ValueError`` when the client's ``socket_timeout`` does
    not exceed ``timeout`` (the wait's, ``durability_timeout``) by at least 1 s: the wait
    is one command, which the client would cut, then resend the add, again and again
    (redis-py retries on a timeout too)."""
    if durability not in DURABILITY:
        raise ValueError(f"durability must be None, 'aof' or 'replica', got {durability!r}")
    where = server_name(client)
    if durability == "aof":
        try:
            client.execute_command("WAITAOF", 1, 0, 1)
        except redis.exceptions.ResponseError as exc:
            if "appendonly" in str(exc):
                raise ServerConfigError(
                    f"durability='aof' needs appendonly yes on Redis at {where} "
                    "(CONFIG SET appendonly yes)"
                ) from None
            raise ServerConfigError(
                f"durability='aof' needs the WAITAOF command (Redis >= 7.2 or valkey); "
                f"Redis at {where} refused it: {exc}"
            ) from None
    elif durability == "replica":
        try:
            replicas = int(client.info("replication").get("connected_slaves", 0))
        except redis.exceptions.ResponseError as exc:
            raise ServerConfigError(
                f"durability='replica': Redis at {where} does not report its replicas ({exc})"
            ) from None
        if replicas < 1:
            raise ServerConfigError(f"durability='replica' but Redis at {where} has no replica")
    pool = getattr(client, "connection_pool", None)
    socket_timeout = getattr(pool, "connection_kwargs", {}).get("socket_timeout")
    if durability is not None and socket_timeout is not None \
            and float(socket_timeout) < timeout + 1.0:
        raise ValueError(
            f"the client's socket_timeout ({socket_timeout} s) must exceed "
            f"durability_timeout ({timeout:g} s) by at least 1 s: the wait for "
            f"{durability} durability could not finish")


def durability_wait(durability: str | None, timeout: float) -> tuple[Any, ...] | None:
    """The command that waits for ``durability`` after a write on the same connection."""
    milliseconds = max(1, int(timeout * 1000))
    if durability == "aof":
        return ("WAITAOF", 1, 0, milliseconds)
    if durability == "replica":
        return ("WAIT", 1, milliseconds)
    return None


def check_durability(durability: str | None, confirmation: Any, client: Any) -> None:
    """Raise :class:`DurabilityError` unless ``confirmation`` (the reply of
    :func:`durability_wait`'s command) confirms ``durability``."""
    if isinstance(confirmation, Exception):
        raise DurabilityError(
            f"the batch was added but {durability} durability could not be confirmed at "
            f"{server_name(client)}: {confirmation}"
        )
    confirmed = confirmation[0] if durability == "aof" else confirmation
    if int(confirmed) < 1:
        what = "the append-only file" if durability == "aof" else "a replica"
        raise DurabilityError(
            f"the batch was added but {what} at {server_name(client)} did not confirm it "
            "within durability_timeout"
        )
