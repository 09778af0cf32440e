"""Connecting to Redis with bounded timeouts and errors that name the server."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.connection import (
    HIREDIS_AVAILABLE,
    Encoder,
    HiredisRespSerializer,
    PythonRespSerializer,
)

from .errors import ServerUnavailableError
from .server import URL_ENV, default_url

__all__ = ["URL_ENV", "RespPacker", "as_client", "connect", "default_url", "redacted"]


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

    def pack(self, *args: Any) -> list[bytes]:
        size = 0
        for arg in args:
            if isinstance(arg, (bytes, bytearray, memoryview)):
                size += len(arg)
        if size < self.LARGE:
            return self._small.pack(*args)
        if isinstance(args[0], str):
            args = (*args[0].encode().split(), *args[1:])
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


def redacted(url: str) -> str:
    """``url`` with any password replaced by ``***``, for error messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def connect(
    url: str | None = None, *, connect_timeout: float = 5.0, socket_timeout: float | None = 60.0
) -> redis.Redis:
    """A Redis client for ``url`` (or ``$REDISBUF_URL``, else the private server of
    :func:`redisbuf.server.default_url`), checked with PING.

    Raises :class:`ServerUnavailableError` naming the URL when the server cannot be
    reached within ``connect_timeout`` seconds.
    """
    url = url or default_url()
    try:
        # probe with the short timeout: a port that accepts and never answers must not
        # hold us for the long socket timeout
        with redis.Redis.from_url(
            url, socket_connect_timeout=connect_timeout, socket_timeout=connect_timeout
        ) as probe:
            probe.ping()
        client = redis.Redis.from_url(
            url,
            socket_connect_timeout=connect_timeout,
            socket_timeout=socket_timeout,
            decode_responses=False,
            retry_on_timeout=False,
            command_packer=RespPacker(),
        )
    except ValueError as exc:
        raise ServerUnavailableError(f"invalid Redis URL {redacted(url)}: {exc}") from exc
    except (redis.exceptions.RedisError, OSError) as exc:
        raise ServerUnavailableError(f"cannot reach Redis at {redacted(url)}: {exc}") from exc
    return client


def as_client(redis_or_url: Any) -> redis.Redis:
    """Accept a client or a URL; refuse clients that decode responses (blobs are bytes)."""
    if redis_or_url is None or isinstance(redis_or_url, str):
        return connect(redis_or_url)
    kwargs = getattr(getattr(redis_or_url, "connection_pool", None), "connection_kwargs", {})
    if kwargs.get("decode_responses"):
        raise ValueError("redisbuf needs a Redis client created with decode_responses=False")
    return redis_or_url
