"""Reverb's descriptions of a table (``reverb.reverb_types``): :class:`TableInfo` and the
small messages it holds, as plain Python objects with the fields and ``HasField`` of
Reverb's protocol buffers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class Message:
    """A protocol-buffer-like record: fields with defaults, ``HasField`` for the ones
    set, equality by value."""

    _defaults: dict[str, Any] = {}
    _oneof: tuple[str, ...] = ()

    def __init__(self, **fields: Any) -> None:
        unknown = set(fields) - set(self._defaults)
        if unknown:
            raise ValueError(f"{type(self).__name__} has no field {sorted(unknown)[0]!r}")
        if len([name for name in fields if name in self._oneof]) > 1:
            raise ValueError(f"{type(self).__name__}: one of {self._oneof} at most")
        self._set = set(fields)
        for name, default in self._defaults.items():
            value = fields.get(name, default)
            object.__setattr__(self, name, value() if callable(value) and name not in fields
                               else value)

    def HasField(self, name: str) -> bool:  # noqa: N802 - the protocol buffers' name
        """Whether ``name`` was set."""
        if name not in self._defaults:
            raise ValueError(f"{type(self).__name__} has no field {name!r}")
        return name in self._set

    def WhichOneof(self, group: str) -> str | None:  # noqa: N802
        """The field of the oneof that is set, if any."""
        return next((name for name in self._oneof if name in self._set), None)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(
            getattr(self, n) == getattr(other, n) for n in self._defaults)

    def __repr__(self) -> str:
        shown = ", ".join(f"{n}={getattr(self, n)!r}" for n in self._defaults if n in self._set)
        return f"{type(self).__name__}({shown})"


class PrioritizedOptions(Message):
    priority_exponent: float
    _defaults = {"priority_exponent": 0.0}


class HeapOptions(Message):
    min_heap: bool
    _defaults = {"min_heap": False}


class KeyDistributionOptions(Message):
    """A selector: one of ``fifo``, ``uniform``, ``prioritized`` (its
    ``priority_exponent``), ``heap`` (its ``min_heap``), ``lifo``; and
    ``is_deterministic``."""

    fifo: bool
    uniform: bool
    prioritized: PrioritizedOptions
    heap: HeapOptions
    lifo: bool
    is_deterministic: bool
    _defaults = {"fifo": False, "uniform": False, "prioritized": PrioritizedOptions,
                 "heap": HeapOptions, "lifo": False, "is_deterministic": False}
    _oneof = ("fifo", "uniform", "prioritized", "heap", "lifo")


class RateLimiterCallStats(Message):
    pending: int
    completed: int
    limited: int
    completed_wait_time: Any
    pending_wait_time: Any
    _defaults = {"pending": 0, "completed": 0, "limited": 0, "completed_wait_time": None,
                 "pending_wait_time": None}


class RateLimiterInfo(Message):
    """A rate limiter's numbers, and the inserts and samples it counted."""

    samples_per_insert: float
    min_diff: float
    max_diff: float
    min_size_to_sample: int
    insert_stats: RateLimiterCallStats
    sample_stats: RateLimiterCallStats
    _defaults = {"samples_per_insert": 0.0, "min_diff": 0.0, "max_diff": 0.0,
                 "min_size_to_sample": 0, "insert_stats": RateLimiterCallStats,
                 "sample_stats": RateLimiterCallStats}


class TableWorkerTime(Message):
    """Reverb's table worker times: redisbuf has no table worker (zeros)."""

    running_ms: int
    sleeping_ms: int
    _defaults = {"running_ms": 0, "sleeping_ms": 0}


@dataclass
class TableInfo:
    """A table's configuration and state, as ``Client.server_info()`` and ``Table.info``
    report it. ``num_episodes`` (the episodes the table's items reference) is counted
    on first access, by a scan of the items."""

    name: str
    sampler_options: KeyDistributionOptions
    remover_options: KeyDistributionOptions
    max_size: int
    max_times_sampled: int
    rate_limiter_info: RateLimiterInfo
    signature: Any
    current_size: int
    num_unique_samples: int
    table_worker_time: TableWorkerTime = field(default_factory=TableWorkerTime)
    episodes_inserted: int = 0
    count_episodes: Callable[[], int] | None = field(default=None, repr=False,
                                                     compare=False)
    _episodes: int | None = field(default=None, repr=False, compare=False)

    @property
    def num_episodes(self) -> int:
        if self._episodes is None:
            self._episodes = self.count_episodes() if self.count_episodes else 0
        return self._episodes

    @property
    def num_deleted_episodes(self) -> int:
        """Episodes once referenced by the table's items and no longer."""
        return max(0, self.episodes_inserted - self.num_episodes)


__all__ = ["HeapOptions", "KeyDistributionOptions", "Message", "PrioritizedOptions",
           "RateLimiterCallStats", "RateLimiterInfo", "TableInfo", "TableWorkerTime"]
