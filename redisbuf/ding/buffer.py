"""DI-engine's ``ding.data.buffer``: ``Buffer``, ``BufferedData``, ``apply_middleware`` and
``DequeBuffer``, on a redisbuf buffer that every process opens by URL and name.

``DequeBuffer(size)`` holds at most ``size`` items and drops the oldest when full, as
DI-engine's deque does; ``DequeBuffer(size, url=..., name=...)`` is that buffer shared:
every process that opens the name pushes to and samples from the same items. Middleware
works as in DI-engine: ``use(fn)`` appends ``fn(action, chain, *args, **kwargs)`` to this
object's chain (a view has its own), and each of ``push``, ``sample``, ``update``,
``delete`` and ``clear`` runs through it in this process. Items are any nest
(:mod:`redisbuf.store.nest`); every read returns new copies of them.
"""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import wraps
from typing import Any

from ..errors import EmptyBufferError
from ..store import nest
from ._shared import Shared, id_of, index_of, meta_of, record

logger = logging.getLogger("redisbuf.ding")


def apply_middleware(func_name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Run a buffer method through the buffer's middleware: the first middleware is called
    as ``mw(func_name, chain, *args, **kwargs)``, ``chain`` calling the next one, and the
    last ``chain`` the method itself (DI-engine's rule).

    Args:
        func_name: the action name the middleware sees (``"push"``, ``"sample"``...).

    Returns:
        A decorator of buffer methods.
    """

    def wrap(method: Callable[..., Any]) -> Callable[..., Any]:
        @wraps(method)
        def handler(buffer: Any, *args: Any, **kwargs: Any) -> Any:
            def run(middleware: list[Callable[..., Any]], *args: Any, **kwargs: Any) -> Any:
                if not middleware:
                    return method(buffer, *args, **kwargs)

                def chain(*args: Any, **kwargs: Any) -> Any:
                    return run(middleware[1:], *args, **kwargs)

                return middleware[0](func_name, chain, *args, **kwargs)

            return run(buffer._middleware, *args, **kwargs)

        return handler

    return wrap


@dataclass
class BufferedData:
    """One item as a buffer returns it: its data, index (a str) and meta (a dict).

    Attributes:
        data: the item.
        index: its index in the buffer.
        meta: its meta information (priority, group, use count...).
    """

    data: Any
    index: str
    meta: dict


class Buffer:
    """DI-engine's buffer interface: ``push``, ``sample``, ``update``, ``delete``,
    ``count``, ``clear``, ``get``, ``save_data`` / ``load_data``, with middleware.

    Args:
        size: the most items the buffer holds.
    """

    def __init__(self, size: int) -> None:
        self._middleware: list[Callable[..., Any]] = []
        self.size = size

    def push(self, data: Any, meta: dict | None = None) -> BufferedData:
        raise NotImplementedError

    def sample(self, size: int | None = None, indices: list[str] | None = None,
               replace: bool = False, sample_range: slice | None = None,
               ignore_insufficient: bool = False, groupby: str | None = None,
               unroll_len: int | None = None) -> list[BufferedData] | list[list[BufferedData]]:
        raise NotImplementedError

    def update(self, index: str, data: Any | None = None, meta: dict | None = None) -> bool:
        raise NotImplementedError

    def delete(self, index: str | Iterable[str]) -> None:
        raise NotImplementedError

    def save_data(self, file_name: str) -> None:
        raise NotImplementedError

    def load_data(self, file_name: str) -> None:
        raise NotImplementedError

    def count(self) -> int:
        raise NotImplementedError

    def clear(self) -> None:
        raise NotImplementedError

    def get(self, idx: int) -> BufferedData:
        raise NotImplementedError

    def use(self, func: Callable[..., Any]) -> Buffer:
        """Append a middleware to this object's chain (see :func:`apply_middleware`).

        Args:
            func: ``func(action, chain, *args, **kwargs)``.

        Returns:
            This buffer.
        """
        self._middleware.append(func)
        return self

    def view(self) -> Buffer:
        """Another object on the same items, with a middleware chain of its own (empty).

        Returns:
            The view.
        """
        return self.__copy__()

    def __copy__(self) -> Buffer:
        raise NotImplementedError

    def __len__(self) -> int:
        return self.count()

    def __getitem__(self, idx: int) -> BufferedData:
        return self.get(idx)


class Storage:
    """A read-only sequence of a buffer's items, oldest first (DI-engine's ``storage``
    deque, read from the server at each access)."""

    def __init__(self, buffer: DequeBuffer) -> None:
        self.buffer = buffer

    def __len__(self) -> int:
        return self.buffer.count()

    def __getitem__(self, idx: int | slice) -> BufferedData | list[BufferedData]:
        if isinstance(idx, slice):
            return list(itertools.islice(iter(self), *idx.indices(len(self))))
        return self.buffer.get(idx)

    def __iter__(self) -> Iterator[BufferedData]:
        return iter(self.buffer)


class Indices:
    """Index -> position in the buffer, oldest first (DI-engine's ``BufferIndex``)."""

    def __init__(self, buffer: DequeBuffer) -> None:
        self.buffer = buffer

    def has(self, key: str) -> bool:
        item_id = id_of(key)
        shared = self.buffer.shared
        return item_id is not None and bool(
            shared.client.hexists(shared.keys.items, index_of(item_id)))

    def get(self, key: str) -> int:
        item_id = id_of(key)
        shared = self.buffer.shared
        rank = None if item_id is None else shared.client.zrank(shared.keys.order, key)
        if rank is None:
            raise KeyError(key)
        return int(rank)

    def __len__(self) -> int:
        return self.buffer.count()


class DequeBuffer(Buffer):
    """DI-engine's ``DequeBuffer`` on a redisbuf buffer: at most ``size`` items, the oldest
    dropped first, shared by every process that opens ``name`` on ``url``.

    Args:
        size: the most items kept (fixed when the buffer is made; opening it with
            another raises ``ConfigMismatchError``, a ``ValueError``).
        sliced: with ``groupby`` and ``unroll_len``, cut each group into consecutive
            windows of ``unroll_len`` and draw one of them (DI-engine's ``sliced``).
        url: a Redis URL or client; ``None``: ``$REDISBUF_URL``, else the process
            tree's private server.
        name: the buffer's name; ``None``: a new private buffer, dropped when this
            object and its views are gone.

    Examples:
        >>> import fakeredis
        >>> from redisbuf.ding import DequeBuffer
        >>> buffer = DequeBuffer(size=2, url=fakeredis.FakeRedis(), name="demo")
        >>> for step in range(3):
        ...     _ = buffer.push({"obs": step}, meta={"env": 0})
        >>> buffer.count(), sorted(item.data["obs"] for item in buffer.sample(2))
        (2, [1, 2])
    """

    def __init__(self, size: int, sliced: bool = False, *, url: Any = None,
                 name: str | None = None, shared: Shared | None = None) -> None:
        super().__init__(size=size)
        self.shared = shared if shared is not None else Shared(size, url, name)
        self.sliced = sliced
        self._meta_keys: list[str] = []

    @property
    def name(self) -> str:
        """The redisbuf buffer's name."""
        return self.shared.name

    # -- middleware-wrapped actions -------------------------------------------------

    @apply_middleware("push")
    def push(self, data: Any, meta: dict | None = None) -> BufferedData:
        """Store ``data`` with ``meta`` as the newest item, dropping the oldest when full.

        Args:
            data: the item (any nest, see :mod:`redisbuf.store.nest`).
            meta: a dict of meta information, or ``None`` (an empty one).

        Returns:
            The item as ``BufferedData``: ``data`` and ``meta`` themselves, its index.

        Raises:
            TypeError: ``data`` or ``meta`` holds a value a nest cannot (nothing stored).
        """
        return self._push(data, meta)

    @apply_middleware("sample")
    def sample(self, size: int | None = None, indices: list[str] | None = None,
               replace: bool = False, sample_range: slice | None = None,
               ignore_insufficient: bool = False, groupby: str | None = None,
               unroll_len: int | None = None) -> list[BufferedData] | list[list[BufferedData]]:
        """Draw ``size`` items uniformly (``replace``: with replacement), or read the items
        of ``indices`` in that order, or draw ``size`` groups of items sharing
        ``meta[groupby]`` (each a list, oldest first; with ``unroll_len``, only groups of at
        least that many, each cut to ``unroll_len`` consecutive items).

        ``sample_range`` restricts the draw to the items at those positions, oldest first
        (``itertools.islice`` bounds: no negative ones). Fewer items (or groups) than
        ``size`` without replacement raise ``ValueError``; with ``ignore_insufficient``
        the call logs a warning and returns an empty list.

        Args:
            size: how many items (groups) to draw.
            indices: the indices of items to read instead.
            replace: draw with replacement.
            sample_range: positions to draw among.
            ignore_insufficient: return ``[]`` instead of raising when too few.
            groupby: the meta key whose values make the groups.
            unroll_len: the number of consecutive items of each group.

        Returns:
            A list of ``BufferedData``, or with ``groupby`` a list of lists.

        Raises:
            AssertionError: the arguments do not go together (as DI-engine's asserts).
            ValueError: too few items or groups.
            KeyError: an index of ``indices`` is not in the buffer.
        """
        assert size or indices, "One of size and indices must not be empty."
        if (size and indices) and (size != len(indices)):
            raise AssertionError("Size and indices length must be equal.")
        if not size:
            size = len(indices)  # type: ignore[arg-type]
        assert not (indices and groupby), "Cannot use groupby and indicex at the same time."
        assert not unroll_len or (unroll_len and groupby), \
            "Parameter unroll_len needs to be used in conjunction with groupby."
        if sample_range is not None:
            _check_range(sample_range)
        sampled: list[Any] | None
        if indices:
            sampled = self._read(list(indices), sample_range)
        elif groupby:
            sampled = self._sample_by_group(size, groupby, replace, unroll_len, sample_range)
        else:
            sampled = self._draw(size, replace, sample_range)
        if sampled is None or len(sampled) != size:
            if not ignore_insufficient:
                raise ValueError(
                    f"There are less than {size} records/groups in buffer({self.count()})")
            logger.warning("Sample operation is ignored due to data insufficient, current "
                           "buffer is %d while sample is %d", self.count(), size)
        return [] if sampled is None else sampled

    @apply_middleware("update")
    def update(self, index: str, data: Any | None = None, meta: dict | None = None) -> bool:
        """Replace the data (unless ``None``) and the meta (unless ``None``) of the item at
        ``index``, on the server: every process reads the new ones.

        Args:
            index: the item's index.
            data: its new data, or ``None`` to keep it.
            meta: its new meta, or ``None`` to keep it.

        Returns:
            Whether the item is in the buffer (``False``: nothing changed).
        """
        return self._update(index, data, meta)

    @apply_middleware("delete")
    def delete(self, indices: str | Iterable[str]) -> None:
        """Remove the items of these indices (an index not in the buffer is skipped).

        Args:
            indices: one index or several.
        """
        if isinstance(indices, str):
            indices = [indices]
        ids = [i for i in map(id_of, indices) if i is not None]
        if ids:
            self.shared.engine.remove(ids)

    @apply_middleware("clear")
    def clear(self) -> None:
        """Remove every item (for every process). Indices are never reused."""
        self.shared.engine.clear()

    # -- reads ------------------------------------------------------------------------

    def count(self) -> int:
        """The number of items the buffer holds now."""
        return len(self.shared.engine)

    def get(self, idx: int) -> BufferedData:
        """The item at position ``idx``, oldest first (negative: from the newest).

        Args:
            idx: the position.

        Returns:
            The item.

        Raises:
            IndexError: no item there.
        """
        shared = self.shared
        members = shared.client.zrange(shared.keys.order, idx, idx)
        if not members:
            raise IndexError("deque index out of range")
        found = self._fetch([int(members[0])])
        if found[0] is None:
            raise IndexError("deque index out of range")
        return found[0]

    def get_by_index(self, index: str) -> BufferedData:
        """The item of ``index``; ``KeyError`` when it is not in the buffer.

        Args:
            index: the item's index.

        Returns:
            The item.
        """
        item_id = id_of(index)
        found = self._fetch([item_id]) if item_id is not None else [None]
        if found[0] is None:
            raise KeyError(index)
        return found[0]

    def __iter__(self) -> Iterator[BufferedData]:
        """The items, oldest first, read in chunks (those removed meanwhile skipped)."""
        shared = self.shared
        members = shared.client.zrange(shared.keys.order, 0, -1)
        for start in range(0, len(members), 256):
            for item in self._fetch([int(m) for m in members[start : start + 256]]):
                if item is not None:
                    yield item

    @property
    def storage(self) -> Storage:
        """The items as a read-only sequence, oldest first (DI-engine's ``storage``)."""
        return Storage(self)

    @property
    def indices(self) -> Indices:
        """Index -> position, oldest first (DI-engine's ``indices``)."""
        return Indices(self)

    @property
    def meta_index(self) -> dict[str, list[Any]]:
        """For each meta key asked for (set ``meta_index = {key: ...}``, or a groupby),
        every item's value of it (``None`` where absent), oldest first."""
        if not self._meta_keys:
            return {}
        metas = self._metas(None)[1]
        return {key: [_get(meta, key) for meta in metas] for key in self._meta_keys}

    @meta_index.setter
    def meta_index(self, value: dict[str, Any]) -> None:
        self._meta_keys = list(value)

    # -- files ------------------------------------------------------------------------

    def save_data(self, file_name: str) -> None:
        """Write every item to ``file_name`` (redisbuf's save format: msgpack, see
        ``ReplayBuffer.save``), making its folder if needed.

        Args:
            file_name: the file.
        """
        import os

        folder = os.path.dirname(file_name)
        if folder and not os.path.exists(folder):
            os.makedirs(folder)
        self.shared.engine.save(file_name)

    def load_data(self, file_name: str) -> None:
        """Replace the buffer's items with those of a file :meth:`save_data` wrote.

        Args:
            file_name: the file.
        """
        self.shared.engine.load(file_name)

    def export_data(self) -> list[BufferedData]:
        """Every item, oldest first (DI-engine before 0.5.3 had this).

        Returns:
            The items.
        """
        return list(self)

    def import_data(self, data_with_meta: list[tuple[Any, dict]]) -> None:
        """Push ``(data, meta)`` pairs in order, without the middleware (DI-engine before
        0.5.3 had this).

        Args:
            data_with_meta: the pairs.
        """
        for data, meta in data_with_meta:
            self._push(data, meta)

    def __copy__(self) -> DequeBuffer:
        return type(self)(size=self.size, sliced=self.sliced, shared=self.shared)

    # -- internals ----------------------------------------------------------------------

    def _push(self, data: Any, meta: dict | None = None) -> BufferedData:
        if meta is None:
            meta = {}
        shared = self.shared
        options: dict[str, Any] = {}
        if shared.max_staleness is not None and isinstance(meta, dict) and (
                "train_iter_data_collected" in meta):
            options["model_version"] = int(meta["train_iter_data_collected"])
        priority = _get(meta, "priority")
        engine = shared.engine
        if priority is not None and shared.per_on():
            result = engine.add([record(data, meta)], priorities=[float(priority)],
                                raise_running_max=False, **options)
        else:
            result = engine.add([record(data, meta)], **options)
        if result.rejected is not None:  # stale already: refused, as a sample would drop it
            return BufferedData(data=data, index=None, meta=meta)  # type: ignore[arg-type]
        return BufferedData(data=data, index=index_of(int(result.ids[0])), meta=meta)

    def _fetch(self, ids: list[int]) -> list[BufferedData | None]:
        """The items of ``ids``, None where not stored."""
        return [None if blob is None else _buffered(item_id, blob)
                for item_id, blob in zip(ids, self._blobs(ids), strict=True)]

    def _read(self, indices: list[str], sample_range: slice | None) -> list[BufferedData]:
        ids = [id_of(index) for index in indices]
        allowed = None
        if sample_range is not None:
            allowed = set(self._range_ids(sample_range))
        known = list(dict.fromkeys(i for i in ids if i is not None))
        blobs = dict(zip(known, self._blobs(known), strict=True))
        out = []
        for index, item_id in zip(indices, ids, strict=True):
            blob = blobs.get(item_id) if item_id is not None else None
            if item_id is None or blob is None or (allowed is not None and
                                                   item_id not in allowed):
                raise KeyError(index)
            out.append(_buffered(item_id, blob))  # each its own objects, repeats too
        return out

    def _blobs(self, ids: list[int]) -> list[bytes | None]:
        """The records of ``ids`` (None where not stored), a PER draw's own first."""
        drawn = getattr(self.shared.local, "drawn", None) or {}
        wanted = [i for i in ids if i not in drawn]
        read = dict(zip(wanted, self.shared.engine.records(wanted), strict=True))
        return [drawn[i] if i in drawn else read[i] for i in ids]

    def _range_ids(self, sample_range: slice) -> list[int]:
        shared = self.shared
        members = shared.client.zrange(shared.keys.order, 0, -1)
        return [int(m) for m in itertools.islice(
            members, sample_range.start, sample_range.stop, sample_range.step)]

    def _draw(self, size: int, replace: bool, sample_range: slice | None
              ) -> list[BufferedData] | None:
        """``size`` items drawn uniformly, or None when too few."""
        engine = self.shared.engine
        window = None
        if sample_range is not None:
            window = slice(sample_range.start or 0, sample_range.stop, sample_range.step)
        available = len(engine) if window is None else _window_length(window, len(engine))
        if available == 0 or (not replace and size > available):
            return None
        try:
            info = engine.sample_with_info(size, replacement=bool(replace), sample_range=window)
        except EmptyBufferError:
            return None
        ids = info.ids.tolist()
        if not replace and len(set(ids)) < len(ids):  # the buffer shrank meanwhile
            return None
        self.shared.remember(ids, info.records)
        records = info.records if info.records is not None else engine.records(ids)
        return [_buffered(item_id, blob) for item_id, blob in zip(ids, records, strict=True)
                if blob is not None]

    def _metas(self, sample_range: slice | None) -> tuple[list[int], list[Any]]:
        """The ids and metas of the items (of ``sample_range``), oldest first."""
        shared = self.shared
        ids = (self._range_ids(sample_range) if sample_range is not None else
               [int(m) for m in shared.client.zrange(shared.keys.order, 0, -1)])
        kept, metas = [], []
        for item_id, blob in zip(ids, shared.engine.records(ids), strict=True):
            if blob is not None:
                kept.append(item_id)
                metas.append(meta_of(blob))
        return kept, metas

    def _sample_by_group(self, size: int, groupby: str, replace: bool,
                         unroll_len: int | None, sample_range: slice | None
                         ) -> list[list[BufferedData]]:
        if groupby not in self._meta_keys:
            self._meta_keys.append(groupby)
        ids, metas = self._metas(None)
        in_range = set(self._range_ids(sample_range)) if sample_range is not None else None
        values = [_get(meta, groupby) for meta in metas]
        if unroll_len and unroll_len > 1:
            counts: dict[Any, int] = {}
            for value in values:
                counts[value] = counts.get(value, 0) + 1
            names = [value for value, count in counts.items() if count >= unroll_len]
            if not names:
                return []
        else:
            names = list(dict.fromkeys(values))
        if replace:
            chosen = random.choices(names, k=size)
        else:
            try:
                chosen = random.sample(names, k=size)
            except ValueError:
                raise ValueError(f"There are less than {size} groups in buffer({len(names)} "
                                 "groups)") from None
        members: dict[Any, list[int]] = {}
        for item_id, meta, value in zip(ids, metas, values, strict=True):
            if isinstance(meta, dict) and groupby in meta and value in chosen and (
                    in_range is None or item_id in in_range):
                members.setdefault(value, []).append(item_id)
        out = []
        for group in chosen:
            group_ids = members.get(group, [])
            if unroll_len:
                group_ids = _window(group_ids, unroll_len, self.sliced)
            out.append(group_ids)
        wanted = sorted({i for group in out for i in group})
        fetched = {i: item for i, item in zip(wanted, self._fetch(wanted), strict=True)
                   if item is not None}
        seen: set[str] = set()
        return [[_copy(fetched[i], seen) for i in group if i in fetched] for group in out]

    def _update(self, index: str, data: Any | None, meta: dict | None) -> bool:
        item_id = id_of(index)
        if item_id is None:
            return False
        shared = self.shared
        engine = shared.engine
        with shared.lock:
            blob = shared.cache.get(item_id)
        for _ in range(32):
            if blob is None:
                blob = engine.records([item_id])[0]
                if blob is None:
                    return False
            if data is None and meta is None:
                return True
            held = nest.decode_nest(blob)
            new = record(held["data"] if data is None else data,
                         held["meta"] if meta is None else meta)
            # PriorityExperienceReplay's new priority, set with the record
            priority = getattr(shared.local, "priority", None)
            done = int(engine.replace([item_id], [new], expected=[blob],
                                      priorities=None if priority is None else [priority])[0])
            if done == 1:
                shared.local.__dict__.pop("priority", None)
                with shared.lock:
                    shared.cache.pop(item_id, None)
                return True
            if done == 0:
                return False
            blob = None  # another process changed it since: read it again
        raise RuntimeError(f"buffer {shared.name!r}: item {index} kept changing under update")


def _get(meta: Any, key: str) -> Any:
    return meta.get(key) if isinstance(meta, dict) else None


def _buffered(item_id: int, blob: bytes) -> BufferedData:
    held = nest.decode_nest(blob)
    return BufferedData(data=held["data"], index=index_of(item_id), meta=held["meta"])


def _copy(item: BufferedData, seen: set[str]) -> BufferedData:
    """``item``, or a copy of it when this sample returned it already (DI-engine's rule:
    every record of a sample is its own object)."""
    if item.index in seen:
        held = nest.decode_nest(nest.encode_nest(record(item.data, item.meta)))
        return BufferedData(data=held["data"], index=item.index, meta=held["meta"])
    seen.add(item.index)
    return item


def _window(ids: list[int], unroll_len: int, sliced: bool) -> list[int]:
    """``unroll_len`` consecutive items of a group (DI-engine's choice of start)."""
    if sliced:
        start = random.choice(range(max(1, len(ids)))) // unroll_len
        if start == (len(ids) - 1) // unroll_len:
            return ids[-unroll_len:]
        return ids[start * unroll_len : start * unroll_len + unroll_len]
    start = random.choice(range(max(1, len(ids) - unroll_len)))
    return ids[start : start + unroll_len]


def _check_range(sample_range: slice) -> None:
    for bound in (sample_range.start, sample_range.stop, sample_range.step):
        if bound is not None and (not isinstance(bound, int) or bound < 0):
            raise ValueError("Indices for islice() must be None or an integer: "
                             "0 <= x <= sys.maxsize.")


def _window_length(window: slice, length: int) -> int:
    return len(range(*window.indices(length)))
