"""StepWriter: appends steps to a :class:`~redisbuf.buffers.steps.StepStore` and makes
items of them in its buffers (the engine of Reverb's ``TrajectoryWriter``).

A step is a flat list of cells, one per column (``None``: no cell in that column at this
step); a column's first cell fixes its dtype and shape, and a later cell of another is
refused (``ValueError``). Each column keeps its last ``num_keep_alive_refs`` cells
alive: an item takes cells only among those (:class:`CellRef`, as :meth:`append`
returns them). :meth:`create_item` never blocks: the item waits in this writer until
the steps it reads that have no chunk yet number ``chunk_length`` (with the default
length, those of about :data:`SEAL_BYTES`; or until :meth:`flush`), then it and every
item waiting with it are *sealed*: their new cells, with every live cell of the same
steps, become chunks (step ranges of one episode, at most ``chunk_length`` steps each)
and a background thread sends chunks and items in one insert each, in order. Before sending, a
buffer's rate limiter admits its items one at a time as Reverb's table does
(:func:`~redisbuf.sampling.limiters.acquire_upto`): items up to the first one not
admitted go, the rest wait. An error of a send is raised by the next :meth:`append`,
:meth:`create_item`, :meth:`flush` or :meth:`end_episode`.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import StepsGoneError, WaitTimeoutError
from ..sampling.waiting import wait_for
from .step_records import encode_chunk_cells, encode_item_raw
from .steps import StepStore, TableBatch

#: How long the sender waits on a rate limiter before looking at ``close`` again (s).
_WAIT_SLICE = 0.25
#: Items waiting unsealed at most: past this many they are sealed whatever their steps.
MAX_UNSEALED = 64
#: The most items one insert sends (queued sends are merged up to it).
MAX_SEND = 512
#: The size a writer aims its chunks at by default (bytes), and their most steps.
CHUNK_BYTES, MAX_CHUNK_LENGTH = 16 * 1024, 32
#: With chunks of the default length, items are sealed once the new steps they read hold
#: about this many bytes (several chunks a seal: a seal's own cost, per call, was a fifth
#: of a writer's time at 4 KiB steps), or :data:`MAX_CHUNK_LENGTH` steps.
SEAL_BYTES = 64 * 1024


def as_cell(value: Any) -> np.ndarray:
    """A cell as a numpy array: Python ints as int64, floats as float64, bools as bool
    (Reverb's conversions)."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, bool):
        return np.asarray(value, dtype=np.bool_)
    if isinstance(value, int):
        return np.asarray(value, dtype=np.int64)
    if isinstance(value, float):
        return np.asarray(value, dtype=np.float64)
    if hasattr(value, "numpy") and not isinstance(value, np.generic):
        return np.asarray(value.numpy())  # torch, TF eager
    return np.asarray(value)


_TF_DTYPES = {"float64": "double", "float32": "float", "float16": "half",
              "complex64": "complex64", "complex128": "complex128"}


def dtype_name(dtype: np.dtype) -> str:
    """A dtype as TensorFlow names it in Reverb's messages (``double``, ``int64``, ...)."""
    if dtype.kind in "USO":
        return "string"
    return _TF_DTYPES.get(dtype.name, dtype.name)


def shape_text(shape: Sequence[int | None]) -> str:
    """A shape as Reverb's messages write it: ``[2,3]``, ``[]``, ``[?,3]``."""
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


class CellRef:
    """A reference to one cell (a column's value at one step) of a :class:`StepWriter`,
    alive while the column keeps it (Reverb's ``WeakCellRef``)."""

    __slots__ = ("__weakref__", "array", "chunk", "column", "episode", "expired_flag",
                 "row", "step", "writer_id")

    def __init__(self, writer_id: str, column: int, episode: int, step: int,
                 array: np.ndarray) -> None:
        self.writer_id, self.column, self.episode, self.step = writer_id, column, episode, step
        self.array = array
        self.chunk: str | None = None  # the chunk holding it, once sealed
        self.row = 0  # its row among its column's cells in that chunk
        self.expired_flag = False

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    @property
    def dtype(self) -> np.dtype:
        return self.array.dtype

    @property
    def expired(self) -> bool:
        """Whether the column no longer keeps the cell (it cannot go into new items)."""
        return self.expired_flag

    def numpy(self) -> np.ndarray:
        """The cell's value.

        Raises:
            RuntimeError: the reference has expired.
        """
        if self.expired_flag:
            raise RuntimeError("the cell reference has expired")
        return self.array

    def __repr__(self) -> str:
        return f"CellRef(column={self.column}, step={self.step}, episode={self.episode})"


@dataclass
class _Item:
    table: str
    priority: float
    columns: list[list[CellRef]]
    squeeze: list[bool]
    record: bytes = b""
    chunks: list[str] = field(default_factory=list)
    first_of_episode: bool = False  # its episode's first item in its table


@dataclass
class _Send:
    """Sealed items and the chunks they need, in order."""

    chunks: dict[str, bytes]
    items: list[_Item]


class StepWriter:
    """Appends steps to ``store`` and makes items of them (see the module).

    Args:
        store: the step store.
        num_keep_alive_refs: how many of its last cells each column keeps alive (>= 1).
        chunk_length: the most steps of one chunk, and how many new steps waiting items
            read before they are sealed; by default set at the first item, to make chunks
            of about :data:`CHUNK_BYTES` (from 1 to :data:`MAX_CHUNK_LENGTH` steps), sealed
            by about :data:`SEAL_BYTES`.
        timeout: how long :meth:`flush` and :meth:`end_episode` wait by default
            (seconds, ``None``: no limit).
        background: send from a thread of the writer's (the default); ``False`` sends in
            :meth:`flush` and :meth:`end_episode`, on the caller's thread.

    Raises:
        ValueError: ``num_keep_alive_refs`` or ``chunk_length`` below 1.
    """

    def __init__(self, store: StepStore, num_keep_alive_refs: int,
                 chunk_length: int | None = None, timeout: float | None = None,
                 background: bool = True) -> None:
        if num_keep_alive_refs < 1:
            raise ValueError(f"num_keep_alive_refs ({num_keep_alive_refs}) must be a "
                             "positive integer")
        if chunk_length is not None and chunk_length < 1:
            raise ValueError(f"chunk_length ({chunk_length}) must be a positive integer")
        self.store = store
        self.num_keep_alive_refs = int(num_keep_alive_refs)
        self.chunk_length = int(chunk_length or num_keep_alive_refs)
        self._auto_length = chunk_length is None
        self._seal_steps = self.chunk_length  # new steps that seal the waiting items
        self.timeout = timeout
        self.writer_id = os.urandom(6).hex()
        self.episode = int.from_bytes(os.urandom(7), "little")
        self.episode_steps = 0  # complete steps of this episode
        self._open = False  # the current step got a partial append
        self._specs: list[tuple[np.dtype, tuple[int, ...]] | None] = []
        self._kept: list[collections.deque[CellRef]] = []
        self._unsealed: list[_Item] = []
        self._fresh_steps: set[tuple[int, int]] = set()  # unsealed items' steps, no chunk
        self._queue: collections.deque[_Send] = collections.deque()
        self._in_flight = 0  # items sealed and not yet confirmed (queued or being sent)
        self._chunk_seq = 0
        # the chunks a live cell or an unsent item holds, to send again should a sweep
        # free them before an item reading them is sent; their holds, by chunk
        self._chunk_blobs: dict[str, bytes] = {}
        self._chunk_holds: collections.Counter[str] = collections.Counter()
        self._error: BaseException | None = None
        self._rng = np.random.default_rng()  # the random removers' uniforms
        # (table, episode) pairs sent (the store counts each table's episodes)
        self._episodes_seen: set[tuple[str, int]] = set()
        self._shut = False
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._send_loop, daemon=True,
                                            name=f"redisbuf-step-writer-{self.writer_id}")
            self._thread.start()

    # -- steps --------------------------------------------------------------------------

    def append(self, cells: Sequence[Any], partial: bool = False) -> list[CellRef | None]:
        """Add a step's cells (``None``: none in that column), or with ``partial`` part of
        the step (the next append adds to the same step). A list longer than before adds
        columns. Returns a reference per cell (``None`` where none).

        Raises:
            ValueError: a cell whose dtype or shape differs from its column's first.
            TypeError: a cell of Python objects.
        """
        self._raise_error()
        specs, kept_all = self._specs, self._kept
        while len(specs) < len(cells):
            specs.append(None)
            kept_all.append(collections.deque())
        arrays: list[np.ndarray | None] = []
        for index, value in enumerate(cells):  # every check before anything is kept
            if value is None:
                arrays.append(None)
                continue
            array = value if type(value) is np.ndarray else as_cell(value)
            spec = specs[index]
            if spec is None:
                if array.dtype.hasobject:
                    raise TypeError(f"column {index}: cells of Python objects cannot be stored")
            elif array.dtype != spec[0]:
                raise ValueError(
                    f"Tensor of wrong dtype provided for column {index}. Got "
                    f"{dtype_name(array.dtype)} but expected {dtype_name(spec[0])}.")
            elif array.shape != spec[1]:
                raise ValueError(
                    f"Tensor of incompatible shape provided for column {index}. Got "
                    f"{shape_text(array.shape)} which is incompatible with "
                    f"{shape_text(spec[1])}.")
            arrays.append(array)
        refs: list[CellRef | None] = []
        keep = self.num_keep_alive_refs
        for index, cell in enumerate(arrays):
            if cell is None:
                refs.append(None)
                continue
            if specs[index] is None:
                specs[index] = (cell.dtype, tuple(cell.shape))
            # a copy: the caller may reuse its array for the next step
            ref = CellRef(self.writer_id, index, self.episode, self.episode_steps,
                          cell.copy())
            kept = kept_all[index]
            kept.append(ref)
            if len(kept) > keep:
                gone = kept.popleft()
                if gone.chunk is None:
                    gone.expired_flag = True
                else:
                    with self._cond:
                        self._expire(gone)
            refs.append(ref)
        self._open = partial
        if not partial:
            self.episode_steps += 1
        return refs

    def _expire(self, ref: CellRef) -> None:
        ref.expired_flag = True
        if ref.chunk is not None:
            self._release_chunk(ref.chunk)

    def _release_chunk(self, key: str, holds: int = 1) -> None:
        """Drop ``holds`` holds of chunk ``key`` (a cell expired, an item was sent); the
        last one forgets its blob. Called with the lock held."""
        self._chunk_holds[key] -= holds
        if self._chunk_holds[key] <= 0:
            del self._chunk_holds[key]
            self._chunk_blobs.pop(key, None)

    def kept(self, column: int) -> list[CellRef]:
        """The cells ``column`` keeps alive, oldest first (at most
        ``num_keep_alive_refs``): those an item may take."""
        return list(self._kept[column]) if column < len(self._kept) else []

    def set_chunk_length(self, length: int) -> None:
        """Chunks of at most ``length`` steps from now on (>= 1)."""
        if length < 1:
            raise ValueError(f"chunk_length ({length}) must be a positive integer")
        self.chunk_length, self._auto_length = int(length), False
        self._seal_steps = self.chunk_length

    @property
    def step_is_open(self) -> bool:
        """Whether the last append was partial."""
        return self._open

    # -- items --------------------------------------------------------------------------

    def create_item(self, table: str, priority: float, columns: Sequence[Sequence[CellRef]],
                    squeeze: Sequence[bool] | None = None) -> None:
        """Make an item of ``table`` with ``priority`` whose flat columns are ``columns``
        (each a list of references of one column of this writer, in the item's order;
        ``squeeze[i]``: column ``i`` is its one cell, without a time dimension). Never
        blocks; the item is sent once sealed (see the module).

        Raises:
            ValueError: an empty or squeezed column of more than one cell, a reference
                that has expired or is another writer's, cells of one column mixed.
        """
        self._raise_error()
        squeeze = [False] * len(columns) if squeeze is None else list(squeeze)
        if not columns:
            raise ValueError("an item needs at least one column")
        checked: list[list[CellRef]] = []
        for index, refs in enumerate(columns):
            refs = list(refs)
            if not refs:
                raise ValueError(f"column {index} of the item has no cell")
            if squeeze[index] and len(refs) != 1:
                raise ValueError(f"squeezed column {index} must hold one cell, got {len(refs)}")
            for ref in refs:
                if not isinstance(ref, CellRef) or ref.writer_id != self.writer_id:
                    raise ValueError(f"column {index} holds a reference not of this writer")
                if ref.expired_flag:
                    raise ValueError(f"column {index} references a cell that has expired "
                                     f"(step {ref.step}: it left the last "
                                     f"{self.num_keep_alive_refs} cells of its column)")
                if ref.column != refs[0].column:
                    raise ValueError(f"column {index} mixes cells of columns "
                                     f"{refs[0].column} and {ref.column}")
            checked.append(refs)
        item = _Item(str(table), float(priority), checked, squeeze)
        if self._auto_length:  # chunks of about CHUNK_BYTES, from this item's cells
            step_bytes = sum(refs[0].array.nbytes for refs in checked) + 8
            self.chunk_length = max(1, min(MAX_CHUNK_LENGTH, CHUNK_BYTES // step_bytes))
            self._seal_steps = max(self.chunk_length,
                                   min(MAX_CHUNK_LENGTH, SEAL_BYTES // step_bytes))
            self._auto_length = False
        fresh = self._fresh_steps
        for refs in checked:
            for ref in refs:
                if ref.chunk is None:
                    fresh.add((ref.episode, ref.step))
        self._unsealed.append(item)  # the user's thread's own list: no lock
        if len(self._unsealed) >= MAX_UNSEALED or len(fresh) >= self._seal_steps:
            with self._cond:
                self._seal(len(self._unsealed))

    def _seal(self, count: int) -> None:
        """Seal the first ``count`` unsealed items: chunk their new cells, encode their
        records, queue them for the sender. Called with the lock held."""
        items, self._unsealed = self._unsealed[:count], self._unsealed[count:]
        if not items:
            return
        fresh: dict[tuple[int, int], dict[int, CellRef]] = {}  # step -> column -> cell
        for item in items:
            for refs in item.columns:
                for ref in refs:
                    if ref.chunk is None:
                        cells = fresh.get((ref.episode, ref.step))
                        if cells is None:
                            cells = fresh[(ref.episode, ref.step)] = {}
                        cells[ref.column] = ref
        self._whole_steps(fresh)
        chunks: dict[str, bytes] = {}
        steps = sorted(fresh)
        start = 0
        while start < len(steps):
            episode = steps[start][0]
            stop = start
            while (stop < len(steps) and steps[stop][0] == episode
                   and stop - start < self.chunk_length):
                stop += 1
            key = f"{self.writer_id}:{self._chunk_seq}"
            self._chunk_seq += 1
            by_column: dict[int, list[CellRef]] = {}
            for step in steps[start:stop]:  # ascending: each column's cells in step order
                for ref in fresh[step].values():
                    by_column.setdefault(ref.column, []).append(ref)
            live = 0
            for refs in by_column.values():
                for row, ref in enumerate(refs):
                    ref.chunk, ref.row = key, row
                    live += 0 if ref.expired_flag else 1
            blob = encode_chunk_cells(episode, {
                column: ([r.step for r in refs], [r.array for r in refs])
                for column, refs in by_column.items()})
            chunks[key] = blob
            self._chunk_blobs[key] = blob
            self._chunk_holds[key] += live
            start = stop
        holds = self._chunk_holds
        seen = self._episodes_seen
        for item in items:
            order: dict[str, int] = {}
            columns = []
            for refs, squeeze in zip(item.columns, item.squeeze, strict=True):
                runs: list[list[int]] = []
                last: list[int] | None = None
                for ref in refs:
                    index = order.get(ref.chunk)  # type: ignore[arg-type]
                    if index is None:
                        index = order[ref.chunk] = len(order)  # type: ignore[index]
                    if last is not None and last[0] == index and last[1] + last[2] == ref.row:
                        last[2] += 1
                    else:
                        last = [index, ref.row, 1]
                        runs.append(last)
                columns.append((refs[0].column, runs, squeeze))
            item.chunks = list(order)
            for key in item.chunks:  # held until the item is sent (or dropped)
                holds[key] = holds.get(key, 0) + 1
            episode = item.columns[-1][-1].episode
            item.record = encode_item_raw(episode, item.chunks, columns, item.priority)
            if (item.table, episode) not in seen:
                seen.add((item.table, episode))
                item.first_of_episode = True
        self._fresh_steps = {  # the steps without a chunk that items left unsealed read
            (ref.episode, ref.step) for item in self._unsealed for refs in item.columns
            for ref in refs if ref.chunk is None}
        self._queue.append(_Send(chunks, items))
        self._in_flight += len(items)
        self._cond.notify_all()

    def _whole_steps(self, fresh: dict[tuple[int, int], dict[int, CellRef]]) -> None:
        """Add to ``fresh`` (step -> column -> cell) every live cell without a chunk of
        its steps, whatever items read: a step's cells then share one chunk, as later
        items of the same steps read them (an item of the last two observations and the
        first one's action would otherwise chunk each step's action alone)."""
        lowest: dict[int, int] = {}
        for episode, step in fresh:
            lowest[episode] = min(lowest.get(episode, step), step)
        only = next(iter(lowest.items())) if len(lowest) == 1 else None
        for kept in self._kept:
            for ref in reversed(kept):  # newest first; within an episode, steps descend
                if only is not None and (ref.episode != only[0] or ref.step < only[1]):
                    break  # older than every fresh step
                if ref.chunk is None:
                    cells = fresh.get((ref.episode, ref.step))
                    if cells is not None:
                        cells.setdefault(ref.column, ref)

    # -- flushing -----------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Items made and not yet confirmed by the server (sealed or not)."""
        with self._cond:
            return len(self._unsealed) + self._in_flight

    def flush(self, block_until_num_items: int = 0, timeout: float | None | str = "default"
              ) -> None:
        """Seal the oldest items so that at most ``block_until_num_items`` wait unsealed,
        then wait until at most that many items are unconfirmed. After ``timeout``
        seconds (default the writer's; ``None``: no limit) raise
        :class:`~redisbuf.errors.WaitTimeoutError`; the sends go on in the background.

        Raises:
            ValueError: ``block_until_num_items`` below 0.
            WaitTimeoutError: the timeout passed first.
        """
        if block_until_num_items < 0:
            raise ValueError(f"block_until_num_items must be >= 0, got {block_until_num_items}")
        wait = self.timeout if isinstance(timeout, str) else timeout
        deadline = None if wait is None else time.monotonic() + float(wait)
        with self._cond:
            self._raise_error_locked()
            if len(self._unsealed) > block_until_num_items:
                self._seal(len(self._unsealed) - block_until_num_items)
            while len(self._unsealed) + self._in_flight > block_until_num_items:
                self._raise_error_locked()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise WaitTimeoutError(
                        f"flush waited {wait:g} s: {len(self._unsealed) + self._in_flight} "
                        f"items are not confirmed yet, above {block_until_num_items}")
                if self._thread is None:  # send here, on the caller's thread
                    self._cond.release()
                    try:
                        self._send_next(deadline)
                    finally:
                        self._cond.acquire()
                    continue
                self._cond.wait(0.5 if left is None else min(left, 0.5))
            self._raise_error_locked()

    def end_episode(self, clear_buffers: bool = True, timeout: float | None | str = "default"
                    ) -> None:
        """Send every item and begin a new episode (``episode_steps`` back to 0; with
        ``clear_buffers`` the columns forget their cells). The episode is new even when
        the wait times out (:class:`~redisbuf.errors.WaitTimeoutError`)."""
        try:
            self.flush(0, timeout)
        finally:
            with self._cond:  # items of the ending episode may still come, none older
                self._episodes_seen = {seen for seen in self._episodes_seen
                                       if seen[1] == self.episode}
            self.episode = int.from_bytes(os.urandom(7), "little")
            self.episode_steps = 0
            self._open = False
            if clear_buffers:
                with self._cond:
                    for kept in self._kept:
                        while kept:
                            self._expire(kept.popleft())

    def close(self) -> None:
        """Stop the sender, as Reverb's writer closes: a send under way ends, items not
        sent yet are dropped (:meth:`flush` first to send them). A second call does
        nothing."""
        with self._cond:
            if self._shut:
                return
            self._shut = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30.0)

    def __enter__(self) -> StepWriter:
        return self

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        """Flush (unless an exception is on its way), then close."""
        try:
            if exc_type is None:
                self.flush()
        finally:
            self.close()

    def _raise_error(self) -> None:
        if self._error is not None:  # set by the sender; checked without the lock first
            with self._cond:
                self._raise_error_locked()

    def _raise_error_locked(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    # -- the sender ---------------------------------------------------------------------

    def _send_loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._shut:
                    self._cond.wait()
                if self._shut:  # closing: what is left is not sent
                    for left in self._queue:
                        self._finished(left.items)
                    self._queue.clear()
                    self._cond.notify_all()
                    return
            self._send_next(None)

    def _send_next(self, deadline: float | None) -> None:
        """Send (part of) the first queued send, waiting for its rate limiters until
        ``deadline`` (monotonic seconds; None: until closed). A failure is kept for the
        user's thread and drops the send."""
        with self._cond:
            if not self._queue:
                return
            if len(self._queue) > 1:  # the sends waiting, as one (up to MAX_SEND items)
                merged = self._queue.popleft()
                while self._queue and len(merged.items) + len(self._queue[0].items) <= MAX_SEND:
                    more = self._queue.popleft()
                    merged = _Send({**merged.chunks, **more.chunks}, merged.items + more.items)
                self._queue.appendleft(merged)
            send = self._queue[0]
        try:
            done = self._send(send, deadline)
        except BaseException as exc:  # noqa: BLE001 - raised on the user's thread
            with self._cond:
                self._queue.popleft()
                self._finished(send.items)
                self._error = exc
                self._cond.notify_all()
            return
        with self._cond:
            self._finished(send.items[:done])
            if done == len(send.items):
                self._queue.popleft()
            elif done:
                send.items = send.items[done:]
                send.chunks = {}
            self._cond.notify_all()

    def _finished(self, items: list[_Item]) -> None:
        """Items sent (or dropped): no longer in flight, their chunks' holds released.
        Called with the lock held."""
        self._in_flight -= len(items)
        for item in items:
            for key in item.chunks:
                self._release_chunk(key)

    def _send(self, send: _Send, deadline: float | None = None) -> int:
        """Send the first items of ``send`` the buffers' rate limiters admit, one at a
        time in order (the insert's own script decides), waiting for a change of the
        buffer that holds the next one back; returns how many were sent (0 when closed
        or past ``deadline`` first)."""
        while True:
            stored, held = self._insert(send)
            if stored:
                return stored
            with self._cond:
                if self._shut:
                    return 0
            if deadline is not None and time.monotonic() >= deadline:
                return 0
            buffer = self.store.table(held)  # type: ignore[arg-type]
            try:
                wait_for(buffer.client, buffer.keys.meta, lambda: None, _WAIT_SLICE,
                         lambda: "", error=WaitTimeoutError)
            except WaitTimeoutError:
                pass

    def _insert(self, send: _Send) -> tuple[int, str | None]:
        """One insert of ``send``'s chunks and items, admitted by the limiters in the
        script; chunks a sweep freed are sent again. Returns (stored, the buffer that
        held the next item back)."""
        batches: dict[str, TableBatch] = {}
        order: list[int] = []
        names: list[str] = []
        for item in send.items:
            batch = batches.get(item.table)
            if batch is None:
                buffer = self.store.table(item.table)
                options: dict[str, Any] = {}
                if buffer.remover is not None and buffer.remover.random:
                    options["evict_u"] = self._rng.random(2 * len(send.items) + 8).tolist()
                batch = batches[item.table] = TableBatch(buffer, [], [], [], options)
                names.append(item.table)
            order.append(names.index(item.table))
            batch.records.append(item.record)
            batch.priorities.append(item.priority)
            batch.refs.append(item.chunks)
            batch.first_of_episode.append(item.first_of_episode)
        chunks = dict(send.chunks)
        for _ in range(3):
            try:
                result = self.store.insert(chunks, [batches[n] for n in names], order)
                return result.stored, result.held
            except StepsGoneError as gone:
                with self._cond:  # append() forgets chunks on the user's thread
                    kept = {key: self._chunk_blobs[key] for key in gone.chunks
                            if key in self._chunk_blobs}
                lost = [key for key in gone.chunks if key not in kept]
                if lost:
                    raise ValueError(
                        f"items reference steps whose chunks the store freed and this "
                        f"writer no longer holds ({lost[:3]}...): they were not inserted"
                    ) from gone
                chunks.update(kept)
        raise AssertionError("chunks freed again and again while being sent")


__all__ = ["CHUNK_BYTES", "MAX_CHUNK_LENGTH", "MAX_UNSEALED", "SEAL_BYTES", "CellRef",
           "StepWriter", "as_cell", "dtype_name", "shape_text"]
