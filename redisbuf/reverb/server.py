"""Reverb's ``Server`` and ``Table`` (``reverb.server``): tables made as shared buffers on a
Redis server, found by name from every process.

``Server(tables)`` starts redisbuf's embedded server (on ``port`` if given) unless a URL
is given (``url=`` or ``$REDISBUF_URL``), and makes each table there (or opens it,
checking its configuration, when another process made it first). Any process reaches
the tables with ``Client("host:port")`` (or a ``redis://`` URL); unlike Reverb's, the
server is not this process: it lives as long as the ``Server`` object that started it
(an embedded one), or as the Redis server (a URL's).
"""

from __future__ import annotations

import collections
import os
import threading
import urllib.parse
from collections.abc import Sequence
from typing import Any

from ..buffers import step_checkpoint
from ..buffers.replay import ReplayBuffer
from ..buffers.steps import StepStore
from ..sampling import limiters as engine_limiters
from ..servers.embedded import EmbeddedServer
from ..store.connection import as_client
from . import checkpointers, item_selectors, nest, pybind, rate_limiters, tables, tensor_spec
from .client import Client
from .reverb_types import TableInfo


class TableExtensionBase:
    """The base of Reverb's table extensions, which run inside Reverb's C++ server;
    redisbuf runs none (a table given one raises ``ValueError``)."""

    def build_internal_extensions(self, table_name: str) -> Sequence[Any]:
        raise NotImplementedError


class Table:
    """A table: items a ``sampler`` selects for sampling and a ``remover`` for removal
    once it holds ``max_size``, under a ``rate_limiter``; an item sampled
    ``max_times_sampled`` times (``< 1``: no limit) is removed.

    Args:
        name: the table's name (letters, digits, ``_ . -``).
        sampler: a selector of :mod:`redisbuf.reverb.selectors`.
        remover: a selector.
        max_size: the most items it holds (> 0).
        rate_limiter: a limiter of :mod:`redisbuf.reverb.rate_limiters`.
        max_times_sampled: as above.
        extensions: must be empty (see :class:`TableExtensionBase`).
        signature: a nest of specs (``tf.TensorSpec``,
            :class:`~redisbuf.reverb.TensorSpec`, any object with ``shape`` and
            ``dtype``) the items' trajectories must fit, or None.

    Raises:
        ValueError: an empty name, ``max_size <= 0``, a signature leaf that is not a
            spec, or an extension.
    """

    def __init__(self, name: str, sampler: pybind.ItemSelector, remover: pybind.ItemSelector,
                 max_size: int, rate_limiter: rate_limiters.RateLimiter,
                 max_times_sampled: int = 0, extensions: Sequence[Any] = (),
                 signature: Any = None) -> None:
        if not name:
            raise ValueError("name must be nonempty")
        if max_size <= 0:
            raise ValueError(f"max_size ({max_size}) must be a positive integer")
        if extensions:
            raise ValueError("table extensions run inside Reverb's C++ server: redisbuf has "
                             "none to run")
        if signature:
            for leaf in nest.flatten(signature):
                if not tensor_spec.is_spec(leaf):
                    raise ValueError(f"Unsupported signature spec: {leaf}")
        self._sampler, self._remover = sampler, remover
        self._rate_limiter = rate_limiter
        self._extensions = tuple(extensions)
        self._signature = signature or None
        self._description = tables.describe(
            name, sampler, remover, max_size, max_times_sampled,
            rate_limiter.internal_limiter, self._signature)
        self._store: StepStore | None = None
        self._buffer: ReplayBuffer | None = None

    @classmethod
    def queue(cls, name: str, max_size: int, extensions: Sequence[Any] = (),
              signature: Any = None) -> Table:
        """A table that is a queue of ``max_size`` items: FIFO sampler and remover, each
        item sampled once, inserts waiting while it is full."""
        return cls(name=name, sampler=item_selectors.Fifo(), remover=item_selectors.Fifo(),
                   max_size=max_size, max_times_sampled=1,
                   rate_limiter=rate_limiters.Queue(max_size), extensions=extensions,
                   signature=signature)

    @classmethod
    def stack(cls, name: str, max_size: int, extensions: Sequence[Any] = (),
              signature: Any = None) -> Table:
        """A table that is a stack of ``max_size`` items (LIFO sampler and remover)."""
        return cls(name=name, sampler=item_selectors.Lifo(), remover=item_selectors.Lifo(),
                   max_size=max_size, max_times_sampled=1,
                   rate_limiter=rate_limiters.Stack(max_size), extensions=extensions,
                   signature=signature)

    @property
    def name(self) -> str:
        return self._description["name"]

    @property
    def info(self) -> TableInfo:
        """The table's TableInfo (its state on the server, once a server made it)."""
        return tables.info(self._description, self._store, self._buffer)

    def can_sample(self, num_samples: int) -> bool:
        """Whether the rate limiter would let a sample of ``num_samples`` through now."""
        if self._buffer is None:
            return False  # empty, and min_size_to_sample >= 1
        return engine_limiters.can(self._buffer.view, "sample", num_samples)

    def can_insert(self, num_inserts: int) -> bool:
        """Whether the rate limiter would let ``num_inserts`` inserts through now."""
        if self._buffer is None:
            spi, min_size, _, max_diff = self._description["rate_limiter"]
            return num_inserts <= min_size or num_inserts * spi <= max_diff
        return engine_limiters.can(self._buffer.view, "insert", num_inserts)

    def replace(self, name: str | None = None, sampler: Any = None, remover: Any = None,
                max_size: int | None = None, rate_limiter: Any = None,
                max_times_sampled: int | None = None, extensions: Any = None,
                signature: Any = None) -> Table:
        """A new, empty table with this one's configuration but for what is given."""
        info = self.info
        if rate_limiter is None:
            limiter = info.rate_limiter_info
            rate_limiter = rate_limiters.RateLimiter(
                samples_per_insert=limiter.samples_per_insert,
                min_size_to_sample=limiter.min_size_to_sample,
                min_diff=limiter.min_diff, max_diff=limiter.max_diff)

        def pick(given: Any, own: Any) -> Any:
            return given if given is not None else own

        return Table(name=pick(name, self.name), sampler=sampler or self._sampler,
                     remover=remover or self._remover, max_size=pick(max_size, info.max_size),
                     rate_limiter=rate_limiter,
                     max_times_sampled=pick(max_times_sampled, info.max_times_sampled),
                     extensions=pick(extensions, self._extensions),
                     signature=pick(signature, self._signature))

    def create_on(self, store: StepStore) -> ReplayBuffer:
        """Make the table's buffer in ``store``'s server (or open it, checking its
        configuration) and attach the table to it (done by :class:`Server`)."""
        buffer = tables.create(store, self._description,
                               self._rate_limiter.internal_limiter)
        self.bind(store, buffer)
        return buffer

    def bind(self, store: StepStore, buffer: ReplayBuffer) -> None:
        """Attach the table to its buffer on a server."""
        self._store, self._buffer = store, buffer

    @property
    def description(self) -> dict[str, Any]:
        """The table's description, as kept with its server's step store."""
        return dict(self._description)

    def __repr__(self) -> str:
        d = self._description
        return (f"Table(name={d['name']}, sampler={self._sampler!r}, remover="
                f"{self._remover!r}, max_size={d['max_size']}, max_times_sampled="
                f"{d['max_times_sampled']}, rate_limiter={self._rate_limiter!r})")


def _address_port(url: str) -> int:
    return urllib.parse.urlsplit(url).port or 6379


class Server:
    """Makes ``tables`` on a Redis server, where every process reaches them.

    Args:
        tables: the tables (at least one, names distinct).
        port: the port of the embedded server it starts (``None``: a free one).
        checkpointer: where checkpoints go and are loaded from (default: a temporary
            directory).
        url: a Redis URL to make the tables on instead of starting a server (default
            ``$REDISBUF_URL``); the server then outlives this object.

    Raises:
        ValueError: no table, two tables of one name, or both ``port`` and a URL.
    """

    def __init__(self, tables: Sequence[Table] | None = None, port: int | None = None,
                 checkpointer: checkpointers.CheckpointerBase | None = None, *,
                 url: str | None = None) -> None:
        if not tables:
            raise ValueError("At least one table must be provided")
        counts = collections.Counter(table.name for table in tables)
        duplicates = [name for name, count in counts.items() if count > 1]
        if duplicates:
            raise ValueError("Multiple items in tables have the same name: "
                             + ", ".join(duplicates))
        url = url or os.environ.get("REDISBUF_URL") or None
        if url is not None and port is not None:
            raise ValueError("give a port (an embedded server is started on it) or a URL, "
                             "not both")
        self._stopped = threading.Event()
        self._embedded: EmbeddedServer | None = None
        if url is None:
            self._embedded = EmbeddedServer(port=port).start()
            url = self._embedded.url
            self._port = self._embedded.port
            self._address = f"localhost:{self._port}"
        else:
            self._port = _address_port(url)
            self._address = url
        self._url = url
        self._client = as_client(url)
        self._store = StepStore(self._client, tables_store_name())
        if checkpointer is None:
            checkpointer = checkpointers.default_checkpointer()
        self._checkpointer = checkpointer.internal_checkpointer()
        self._tables = {table.name: table for table in tables}
        loaded = self._load_checkpoint()
        for table in tables:
            buffer = loaded.get(table.name)
            if buffer is None:
                table.create_on(self._store)
            else:
                table.bind(self._store, buffer)
        self._client.hset(self._store.keys.meta, "checkpoint_root", self._checkpointer.path)

    def _load_checkpoint(self) -> dict[str, ReplayBuffer]:
        found: Any = step_checkpoint.latest(self._checkpointer.path)
        if found is None and self._checkpointer.fallback_checkpoint_path:
            found = self._checkpointer.fallback_checkpoint_path
        if found is None:
            return {}

        def open_buffer(name: str, description: dict[str, Any]) -> ReplayBuffer:
            spi, min_size, min_diff, max_diff = description["rate_limiter"]
            limiter = engine_limiters.RateLimiter(spi, min_size, min_diff, max_diff,
                                                  timeout=None)
            return tables.create(self._store, description, limiter)

        return step_checkpoint.load(self._store, found, open_buffer)

    def __del__(self) -> None:
        try:
            self.stop()
        except Exception:  # noqa: BLE001 - a finalizer must not raise
            pass

    def __repr__(self) -> str:
        return f"Server(address={self._address!r}, tables={sorted(self._tables)})"

    @property
    def port(self) -> int:
        """The port of the Redis server holding the tables."""
        return self._port

    @property
    def url(self) -> str:
        """The Redis URL of the server holding the tables."""
        return self._url

    def stop(self) -> None:
        """Stop the embedded server this object started (a URL's server stays up, its
        tables with it). A second call does nothing."""
        self._stopped.set()
        if self._embedded is not None:
            embedded, self._embedded = self._embedded, None
            try:
                self._client.close()
            except Exception:  # noqa: BLE001 - the server goes anyway
                pass
            embedded.stop()

    def wait(self) -> None:
        """Block until :meth:`stop` is called (by another thread).

        Raises:
            KeyboardInterrupt: on Ctrl-C.
        """
        while not self._stopped.wait(0.5):
            pass

    def localhost_client(self) -> Client:
        """A :class:`~redisbuf.reverb.Client` of this server."""
        return Client(self._address)


def tables_store_name() -> str:
    """The name of the step store every table of a server references."""
    return tables.STORE



__all__ = ["Server", "Table", "TableExtensionBase"]
