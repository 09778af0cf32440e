"""Connecting to Redis with bounded timeouts and errors that name the server."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis

from .errors import ServerUnavailableError

URL_ENV = "REDISBUF_URL"


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
    """A Redis client for ``url`` (or ``$REDISBUF_URL``), checked with PING.

    Raises :class:`ServerUnavailableError` naming the URL when the server cannot be
    reached within ``connect_timeout`` seconds.
    """
    url = url or os.environ.get(URL_ENV)
    if not url:
        raise ServerUnavailableError(f"no Redis URL given and ${URL_ENV} is not set")
    try:
        client = redis.Redis.from_url(
            url,
            socket_connect_timeout=connect_timeout,
            socket_timeout=socket_timeout,
            decode_responses=False,
            retry_on_timeout=False,
        )
        client.ping()
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
        raise ServerUnavailableError(f"cannot reach Redis at {redacted(url)}: {exc}") from exc
    except ValueError as exc:
        raise ServerUnavailableError(f"invalid Redis URL {redacted(url)}: {exc}") from exc
    return client


def as_client(redis_or_url: Any) -> redis.Redis:
    """Accept a client or a URL; refuse clients that decode responses (blobs are bytes)."""
    if redis_or_url is None or isinstance(redis_or_url, str):
        return connect(redis_or_url)
    kwargs = getattr(getattr(redis_or_url, "connection_pool", None), "connection_kwargs", {})
    if kwargs.get("decode_responses"):
        raise ValueError("redisbuf needs a Redis client created with decode_responses=False")
    return redis_or_url
