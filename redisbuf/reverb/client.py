"""Reverb's ``Client`` and legacy ``Writer`` (``reverb.client``) on redisbuf tables.

``Client("host:port")`` (or a ``redis://`` URL) reaches the tables of a
:class:`~redisbuf.reverb.Server` on that Redis server; it connects on first use and is
picklable, so actor processes can be handed one.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..buffers import step_checkpoint
from ..buffers.replay import ReplayBuffer
from ..buffers.step_writer import StepWriter
from ..buffers.steps import StepStore
from ..errors import ServerUnavailableError
from ..store.connection import connect
from . import errors, nest, replay_sample, tables
from .reverb_types import TableInfo
from .tensor_spec import flat_specs

#: the most samples ``Client.sample`` draws in one request
_SAMPLE_AHEAD = 256


def url_of(address: str) -> str:
    """The Redis URL of a Reverb server address (``host:port``; URLs pass)."""
    if "://" in address:
        return address
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"server address {address!r} is neither host:port nor a URL")
    return f"redis://{host}:{port}/0"


class Writer:
    """Reverb's legacy writer (``Client.writer``): appends steps of one structure and
    makes items of the last ``num_timesteps`` steps of every column."""

    def __init__(self, internal_writer: _LegacyWriter) -> None:
        self._writer = internal_writer
        self._closed = False

    def __enter__(self) -> Writer:
        if self._closed:
            raise ValueError("Cannot reuse already closed Writer")
        return self

    def __exit__(self, *exc: object) -> None:
        self.flush()
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            try:
                self.close()
            except Exception:  # noqa: BLE001 - a finalizer must not raise
                pass

    def __repr__(self) -> str:
        return f"{self._writer!r}, closed: {self._closed}"

    def append(self, data: Any) -> None:
        """Add a step (any nest; every step of the same structure)."""
        self._writer.Append(nest.flatten(data))

    def append_sequence(self, sequence: Any) -> None:
        """Add ``T`` steps at once: every leaf of ``sequence`` has the leading dimension
        ``T``."""
        self._writer.AppendSequence(nest.flatten(sequence))

    def create_item(self, table: str, num_timesteps: int, priority: float) -> None:
        """Make an item of ``table`` holding the last ``num_timesteps`` steps.

        Raises:
            ValueError: ``num_timesteps < 1``, or more steps than the writer holds.
        """
        if num_timesteps < 1:
            raise ValueError(f"num_timesteps ({num_timesteps}) must be a positive integer")
        self._writer.CreateItem(table, num_timesteps, priority)

    def flush(self) -> None:
        """Send every item made, waiting until the server has them."""
        self._writer.Flush()

    def close(self, retry_on_unavailable: bool = True) -> None:
        """Send every item made, then close (the writer cannot be used again).

        Raises:
            ValueError: it was closed already.
        """
        if self._closed:
            raise ValueError("close() has already been called on Writer.")
        self._closed = True
        self._writer.Close(retry_on_unavailable)


class _LegacyWriter:
    """The internal writer of :class:`Writer`, over a synchronous StepWriter."""

    def __init__(self, writer: StepWriter) -> None:
        self._writer = writer
        self._refs: collections.deque[list[Any]] = collections.deque(
            maxlen=writer.num_keep_alive_refs)

    def __repr__(self) -> str:
        return (f"Writer(max_sequence_length={self._writer.num_keep_alive_refs}, "
                f"chunk_length={self._writer.chunk_length})")

    def Append(self, flat: Sequence[Any]) -> None:  # noqa: N802 - Reverb's C++ names
        self._refs.append(self._writer.append(list(flat)))

    def AppendSequence(self, flat: Sequence[Any]) -> None:  # noqa: N802
        arrays = [np.asarray(leaf) for leaf in flat]
        lengths = {len(a) for a in arrays}
        if len(lengths) != 1:
            raise ValueError(f"the leaves of a sequence must share their first dimension, "
                             f"got {sorted(lengths)}")
        for step in range(lengths.pop()):
            self.Append([a[step] for a in arrays])

    def CreateItem(self, table: str, num_timesteps: int, priority: float) -> None:  # noqa: N802
        if num_timesteps > len(self._refs):
            raise ValueError(f"num_timesteps ({num_timesteps}) is above the steps the writer "
                             f"holds ({len(self._refs)})")
        steps = list(self._refs)[-num_timesteps:]
        columns = [[step[c] for step in steps] for c in range(len(steps[-1]))]
        self._writer.create_item(table, priority, columns, [False] * len(columns))

    def Flush(self) -> None:  # noqa: N802
        self._writer.flush(0)

    def Close(self, retry_on_unavailable: bool = True) -> None:  # noqa: N802
        try:
            self._writer.flush(0)
        finally:
            self._writer.close()


class Client:
    """Reaches the tables of the server at ``server_address`` (``host:port`` or a Redis
    URL). Connects on first use; picklable.

    Args:
        server_address: the address.
    """

    def __init__(self, server_address: str) -> None:
        self._server_address = server_address
        self._signature_cache: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._store: StepStore | None = None
        self._buffers: dict[str, ReplayBuffer] = {}

    def __reduce__(self) -> tuple[Any, ...]:
        return self.__class__, (self._server_address,)

    def __repr__(self) -> str:
        return f"Client, server_address={self._server_address}"

    @property
    def server_address(self) -> str:
        return self._server_address

    # -- plumbing -----------------------------------------------------------------------

    def store(self, timeout: float | None = None) -> StepStore:
        """The server's step store (connecting on first use, within ``timeout`` seconds
        when given)."""
        with self._lock:
            if self._store is None:
                client = connect(url_of(self._server_address),
                                 connect_timeout=5.0 if timeout is None else float(timeout))
                self._store = StepStore(client, tables.STORE)
            return self._store

    def _descriptions(self) -> dict[str, dict[str, Any]]:
        store = self.store()
        found = store.descriptions()
        pipe = store.client.pipeline(transaction=False)
        for name in found:
            pipe.exists(f"rb:{{{name}}}:meta")
        present = pipe.execute()
        return {name: d for (name, d), here in zip(found.items(), present, strict=True) if here}

    def table(self, name: str) -> ReplayBuffer:
        """The buffer of table ``name`` (opened once per client).

        Raises:
            ValueError: the server has no such table.
        """
        with self._lock:
            buffer = self._buffers.get(name)
        if buffer is not None:
            return buffer
        descriptions = self._descriptions()
        if name not in descriptions:
            raise ValueError(f'Could not find table "{name}". The following tables exists: '
                             f'{", ".join(sorted(descriptions))}.')
        buffer = tables.open_table(self.store(), name, descriptions[name])
        with self._lock:
            self._buffers.setdefault(name, buffer)
            return self._buffers[name]

    def _flat_signatures(self) -> dict[str, Any]:
        out = {}
        for name, description in self._descriptions().items():
            signature = tables.signature_of(description)
            out[name] = None if signature is None else flat_specs(signature)
        return out

    def _new_store(self) -> StepStore:
        """A StepStore of the server for one writer (its own table cache)."""
        store = self.store()
        return StepStore(store.client, store.name)

    # -- inserting ----------------------------------------------------------------------

    def insert(self, data: Any, priorities: dict[str, float]) -> None:
        """Insert ``data`` (any nest) as one item in each table of ``priorities`` (table
        -> priority); its steps are stored once, whatever the number of tables.

        Raises:
            ValueError: ``priorities`` is empty.
        """
        if not priorities:
            raise ValueError("priorities must contain at least one item")
        with self.writer(max_sequence_length=1) as writer:
            writer.append(data)
            for table, priority in priorities.items():
                writer.create_item(table=table, num_timesteps=1, priority=priority)

    def writer(self, max_sequence_length: int, delta_encoded: bool = False,
               chunk_length: int | None = None, max_in_flight_items: int | None = 25
               ) -> Writer:
        """A legacy :class:`Writer` whose items span at most ``max_sequence_length``
        steps (``delta_encoded`` is accepted and has no effect; ``chunk_length`` is the
        most steps per chunk).

        Raises:
            ValueError: ``max_sequence_length < 1``, ``chunk_length`` outside [1,
                ``max_sequence_length``], or ``max_in_flight_items < 1``.
        """
        if max_sequence_length < 1:
            raise ValueError(f"max_sequence_length ({max_sequence_length}) must be a positive "
                             "integer")
        if chunk_length is None:
            chunk_length = min(10, max_sequence_length)
        if chunk_length < 1 or chunk_length > max_sequence_length:
            raise ValueError(f"chunk_length ({chunk_length}) must be a positive integer le to "
                             f"max_sequence_length ({max_sequence_length})")
        if max_in_flight_items is not None and max_in_flight_items < 1:
            raise ValueError(f"max_in_flight_items ({max_in_flight_items}) must be a positive "
                             "integer")
        step_writer = StepWriter(self._client_store_for_writer(), max_sequence_length,
                                 chunk_length=chunk_length, background=False)
        return Writer(_LegacyWriter(step_writer))

    def _client_store_for_writer(self) -> StepStore:
        # writers share this client's store object: its table cache is read-only to them
        return self.store()

    def trajectory_writer(self, num_keep_alive_refs: int, *, validate_items: bool = True
                          ) -> Any:
        """A :class:`~redisbuf.reverb.TrajectoryWriter` whose columns keep their last
        ``num_keep_alive_refs`` cells (the longest span of an item). With
        ``validate_items`` every item is checked against its table's signature (and its
        table must exist) when it is made.

        Raises:
            ValueError: ``num_keep_alive_refs < 1``.
        """
        from .trajectory_writer import InternalWriter, TrajectoryWriter

        if num_keep_alive_refs < 1:
            raise ValueError(f"num_keep_alive_refs ({num_keep_alive_refs}) must be a positive "
                             "integer")
        step_writer = StepWriter(self._client_store_for_writer(), num_keep_alive_refs)
        signatures = self._flat_signatures if validate_items else None
        return TrajectoryWriter(InternalWriter(step_writer, signatures))

    def structured_writer(self, configs: Sequence[Any]) -> Any:
        """A :class:`~redisbuf.reverb.structured_writer.StructuredWriter` inserting items
        as ``configs`` say.

        Raises:
            ValueError: ``configs`` is empty or holds an invalid config.
        """
        from . import structured_writer

        if not configs:
            raise ValueError("At least one config must be provided.")
        return structured_writer.StructuredWriter(
            structured_writer.InternalStructuredWriter(self._client_store_for_writer(),
                                                       list(configs)))

    # -- sampling -----------------------------------------------------------------------

    def sample(self, table: str, num_samples: int = 1, *, emit_timesteps: bool = True,
               unpack_as_table_signature: bool = False) -> Iterator[Any]:
        """Yield ``num_samples`` samples of ``table``, waiting while the table (or its
        rate limiter) has none to give. Each is a list of one
        :class:`~redisbuf.reverb.ReplaySample` per step of its trajectory
        (``emit_timesteps``), or one ReplaySample of the whole trajectory, its data
        unpacked as the table's signature when asked and it has one, else flat.

        Raises:
            ValueError: ``emit_timesteps`` and a trajectory whose columns differ in
                length; an unknown table.
        """
        signature = self._get_signature_for_table(table) if unpack_as_table_signature \
            else None

        def unflatten(flat: list[Any]) -> Any:
            return nest.unflatten_as(signature, flat) if signature else flat

        buffer = self.table(table)
        store = self.store()
        left = num_samples
        while left > 0:
            # drawn ahead in requests of up to _SAMPLE_AHEAD, as Reverb's sampler streams
            drawn = store.sample(buffer, min(left, _SAMPLE_AHEAD))
            for item in drawn:
                left -= 1
                info = replay_sample.SampleInfo(key=item.key, probability=item.probability,
                                                table_size=item.table_size,
                                                priority=item.priority,
                                                times_sampled=item.times_sampled)
                data = item.columns
                if emit_timesteps:
                    if len({len(column) if column.ndim else -1 for column in data}) != 1:
                        raise ValueError("Can't split non timestep trajectory into timesteps.")
                    yield [replay_sample.ReplaySample(
                        info=info, data=unflatten([np.asarray(column[i], column.dtype)
                                                   for column in data]))
                        for i in range(len(data[0]))]
                else:
                    yield replay_sample.ReplaySample(info, unflatten(list(data)))

    # -- managing -----------------------------------------------------------------------

    def mutate_priorities(self, table: str, updates: dict[int, float] | None = None,
                          deletes: list[int] | None = None) -> None:
        """Set the priorities of items (``updates``: key -> priority) of ``table``, then
        remove the items ``deletes``; keys not found are skipped."""
        buffer = self.table(table)
        if updates:
            buffer.update_priority(np.fromiter(updates.keys(), dtype=np.int64),
                                   np.fromiter(updates.values(), dtype=np.float64))
        if deletes:
            buffer.remove(np.asarray(list(deletes), dtype=np.int64))

    def update_priorities(self, table: str, keys: Any, priorities: Any) -> None:
        """Set the priorities of the items ``keys`` (TFClient's ``update_priorities``,
        with arrays: ``keys`` as the samples' ``info.key``)."""
        keys = np.asarray(keys).astype(np.int64).reshape(-1)
        self.table(table).update_priority(keys, np.asarray(priorities, dtype=np.float64))

    def reset(self, table: str) -> None:
        """Remove every item of ``table`` and reset its rate limiter."""
        buffer = self.table(table)
        buffer.clear()
        self.store().reset_counts(table)

    def server_info(self, timeout: int | None = None) -> dict[str, TableInfo]:
        """Every table's :class:`~redisbuf.reverb.reverb_types.TableInfo`, by name.

        Raises:
            DeadlineExceededError: ``timeout`` (seconds) passed before the server
                answered.
        """
        try:
            store = self.store(timeout)
            descriptions = self._descriptions()
        except ServerUnavailableError:
            if timeout is None:
                raise
            raise errors.DeadlineExceededError(
                f"ServerInfo call did not complete within provided timeout of {timeout}s"
            ) from None
        infos = {name: tables.info(d, store, self.table(name))
                 for name, d in descriptions.items()}
        if not self._signature_cache:
            self._signature_cache = {name: info.signature for name, info in infos.items()}
        return infos

    def checkpoint(self) -> str:
        """Write a checkpoint of every table of the server under the server's
        checkpointer path; returns its directory."""
        store = self.store()
        root = store.client.hget(store.keys.meta, "checkpoint_root")
        if root is None:
            raise ValueError("the server's step store names no checkpoint directory")
        buffers = {name: self.table(name) for name in self._descriptions()}
        return step_checkpoint.save(store, buffers, root.decode())

    def _get_signature_for_table(self, table: str) -> Any:
        if not self._signature_cache:
            self.server_info()
        if table not in self._signature_cache:
            raise ValueError(f'Could not find table "{table}". The following tables exists: '
                             f'{", ".join(self._signature_cache.keys())}.')
        return self._signature_cache[table]


__all__ = ["Client", "Writer", "url_of"]
