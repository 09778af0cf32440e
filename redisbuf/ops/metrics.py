"""Read-only views of buffers for operators: snapshots, rate history, log-reward
histograms, and a Prometheus collector.

Everything here only reads (it works on a replica or a full server). The rate history is
the capped time series that the insert script of every buffer class keeps in its meta
hash (``lua/_history.lua``; :data:`LAYOUTS` says where and in which unit); sample rates
between two snapshots come from the difference of the sampled counter.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

import redis

from ..store import bounds
from ..store.keys import PREFIX, BufferKeys

HIST_STEP = 10  # seconds per history bucket; the same as lua/_history.lua
HIST_SLOTS = 360


@dataclass(frozen=True)
class Layout:
    """Where one buffer class keeps its meta hash and the three counters its rate history
    snapshots (``lua/_history.lua``, called by the class's insert script with the same
    field names), and the unit they count."""

    buffer_class: str
    meta_suffix: str  # the meta hash is rb:{name}:<meta_suffix>
    inserted: str
    evicted: str
    sampled: str
    unit: str


# Every buffer class, in the order a name holding several is reported.
LAYOUTS: dict[str, Layout] = {
    layout.buffer_class: layout
    for layout in (
        # ReplayBuffer: lua/add.lua and the other add scripts (via _insert.lua)
        Layout("buffer", "meta", "inserted", "evicted", "sampled", "items"),
        # SequenceBuffer: lua/seq_add.lua; sampled = steps of the windows seq_sample drew
        Layout("sequence", "seq:meta", "added", "evicted", "sampled", "steps"),
        # EpisodeBuffer: lua/episode_push.lua; sampled = episodes and windows drawn
        Layout("episodes", "episodes:meta", "pushed", "evicted", "sampled", "episodes"),
        # FragmentBuffer: lua/fragment_add.lua; evicted = over max_chunks only (stale and
        # used-up chunks are counted apart); sampled = chunks fetched
        Layout("fragments", "fragments:meta", "chunks_added", "chunks_evicted", "fetched",
               "chunks"),
    )
}


@dataclass
class Snapshot:
    """What a buffer looks like at one moment (``at``: this machine's clock)."""

    name: str
    at: float
    capacity: int
    length: int
    kind: str | None
    eviction: str | None
    inserted: int
    evicted: int
    sampled: int
    memory_bytes: int | None
    last_insert: float | None
    baseline: float | None
    manager_running: bool
    workers_alive: int
    history: list[HistoryPoint] = field(default_factory=list)
    buffer_class: str = "buffer"  # a key of LAYOUTS
    unit: str = "items"  # what length, capacity, the counters and the history count
    # records set aside because they do not decode (a ReplayBuffer's meta quarantined,
    # redisbuf/buffers/quarantine.py); 0 for the other classes
    quarantined: int = 0

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["history"] = [asdict(point) for point in self.history]
        return data


@dataclass
class HistoryPoint:
    """The buffer's counters at the end of one history bucket starting at ``t``."""

    t: float
    inserted: int
    evicted: int
    sampled: int


@dataclass
class Rate:
    """Items per second between two moments."""

    t: float
    inserted: float
    evicted: float
    sampled: float


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _float(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def parse_history(meta: dict[str, str]) -> list[HistoryPoint]:
    """The history buckets of a decoded meta hash, oldest first (malformed ones skipped;
    slots older than the ring's span are dropped)."""
    points = []
    for key, value in meta.items():
        if not key.startswith("hist:"):
            continue
        parts = value.split()
        if len(parts) != 4:
            continue
        try:
            bucket, inserted, evicted, sampled = (int(p) for p in parts)
        except ValueError:
            continue
        points.append(HistoryPoint(float(bucket * HIST_STEP), inserted, evicted, sampled))
    points.sort(key=lambda p: p.t)
    if points:
        newest = points[-1].t
        points = [p for p in points if p.t > newest - HIST_SLOTS * HIST_STEP]
    return points


def _delta(new: int, old: int) -> int:
    # counters restart at 0 on clear(): count what was done since then
    return new - old if new >= old else new


def history_rates(points: Sequence[HistoryPoint]) -> list[Rate]:
    """Rates between consecutive history buckets (at the later bucket's time)."""
    rates = []
    for old, new in zip(points, points[1:], strict=False):
        span = new.t - old.t
        if span <= 0:
            continue
        rates.append(
            Rate(
                new.t,
                _delta(new.inserted, old.inserted) / span,
                _delta(new.evicted, old.evicted) / span,
                _delta(new.sampled, old.sampled) / span,
            )
        )
    return rates


def rate_between(old: Snapshot, new: Snapshot) -> Rate:
    """Rates between two snapshots of one buffer (sampling included: the difference of
    the ``sampled`` counter as this reader saw it)."""
    span = max(new.at - old.at, 1e-9)
    return Rate(
        new.at,
        _delta(new.inserted, old.inserted) / span,
        _delta(new.evicted, old.evicted) / span,
        _delta(new.sampled, old.sampled) / span,
    )


def buffer_names(client: redis.Redis) -> list[str]:
    """Every buffer in this Redis database (SCAN over the meta keys, never KEYS), sorted."""
    prefix, suffix = f"{PREFIX}:{{", "}:meta"
    names = set()
    for key in client.scan_iter(match=f"{PREFIX}:{{*}}:meta", count=1000):
        text = _text(key)
        if text.startswith(prefix) and text.endswith(suffix):
            names.add(text[len(prefix) : -len(suffix)])
    return sorted(names)


def every_buffer(client: redis.Redis) -> list[tuple[str, str]]:
    """``(name, buffer class)`` of every buffer of every class of :data:`LAYOUTS` in this
    Redis database (SCAN over the meta keys, never KEYS), sorted. A name may appear once
    per class."""
    prefix = f"{PREFIX}:{{"
    classes = {layout.meta_suffix: layout.buffer_class for layout in LAYOUTS.values()}
    found = set()
    for key in client.scan_iter(match=f"{PREFIX}:{{*}}:*meta", count=1000):
        text = _text(key)
        # a valid name holds no "}" (keys.NAME_PATTERN): the first "}:" ends it
        name, sep, suffix = text[len(prefix) :].partition("}:")
        if text.startswith(prefix) and sep and suffix in classes:
            found.add((name, classes[suffix]))
    order = list(LAYOUTS)
    return sorted(found, key=lambda pair: (pair[0], order.index(pair[1])))


def _memory(client: redis.Redis, keys: Iterable[str]) -> int | None:
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.memory_usage(key, samples=bounds.MEMORY_USAGE_SAMPLES)  # not all: bounded
    try:
        return sum(int(used or 0) for used in pipe.execute())
    except redis.exceptions.ResponseError:
        return None


def buffer_classes(client: redis.Redis, name: str) -> list[str]:
    """The buffer classes (keys of :data:`LAYOUTS`) that have a buffer called ``name``:
    one pipeline of EXISTS on their meta hashes."""
    prefix = f"{PREFIX}:{{{name}}}:"
    pipe = client.pipeline(transaction=False)
    for layout in LAYOUTS.values():
        pipe.exists(prefix + layout.meta_suffix)
    return [c for c, found in zip(LAYOUTS, pipe.execute(), strict=True) if found]


def class_keys(buffer_class: str, name: str) -> Any:
    """The key names of the buffer ``name`` of ``buffer_class`` (a key of
    :data:`LAYOUTS`): :class:`~redisbuf.store.keys.BufferKeys`,
    :class:`~redisbuf.buffers.sequence.SequenceKeys`,
    :class:`~redisbuf.buffers.episodes.EpisodeKeys` or
    :class:`~redisbuf.buffers.fragments.FragmentKeys`; each has ``all_keys()`` and
    ``describe()``."""
    if buffer_class == "buffer":
        return BufferKeys(name)
    if buffer_class == "sequence":
        from ..buffers.sequence import SequenceKeys

        return SequenceKeys(name)
    if buffer_class == "episodes":
        from ..buffers.episodes import EpisodeKeys

        return EpisodeKeys(name)
    if buffer_class == "fragments":
        from ..buffers.fragments import FragmentKeys

        return FragmentKeys(name)
    raise ValueError(f"unknown buffer class {buffer_class!r}: one of {', '.join(LAYOUTS)}")


def _class_snapshot(
    client: redis.Redis, name: str, layout: Layout, memory: bool
) -> Snapshot | None:
    """A snapshot of a sequence, episode or fragment buffer: its own length and capacity
    (steps, episodes, chunks), counters and history; no manager or workers."""
    meta_key = f"{PREFIX}:{{{name}}}:{layout.meta_suffix}"
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(meta_key)
    if layout.buffer_class == "episodes":
        pipe.zcard(f"{PREFIX}:{{{name}}}:episodes:index")
    elif layout.buffer_class == "fragments":
        pipe.zcard(f"{PREFIX}:{{{name}}}:fragments:chunks")
    raw, *counted = pipe.execute()
    at = time.time()
    meta = {_text(k): _text(v) for k, v in raw.items()}
    if layout.buffer_class == "sequence":
        if "num_environments" not in meta:
            return None
        length = _int(meta.get("size"))
        capacity = _int(meta.get("num_environments")) * _int(meta.get("max_length"))
    elif layout.buffer_class == "episodes":
        if "capacity" not in meta:
            return None
        length, capacity = int(counted[0]), _int(meta.get("capacity"))
    else:
        if "max_chunks" not in meta:
            return None
        length, capacity = int(counted[0]), _int(meta.get("max_chunks"))
    return Snapshot(
        name=name,
        at=at,
        capacity=capacity,
        length=length,
        kind=meta.get("kind", layout.buffer_class),
        eviction="fifo",  # all three evict their oldest (steps, episodes, chunks) first
        inserted=_int(meta.get(layout.inserted)),
        evicted=_int(meta.get(layout.evicted)),
        sampled=_int(meta.get(layout.sampled)),
        memory_bytes=(
            _memory(client, class_keys(layout.buffer_class, name).all_keys()) if memory else None
        ),
        last_insert=_float(meta.get("last_insert")),
        baseline=None,
        manager_running=False,
        workers_alive=0,
        history=parse_history(meta),
        buffer_class=layout.buffer_class,
        unit=layout.unit,
    )


def snapshot(
    client: redis.Redis, name: str, *, memory: bool = True, buffer_class: str = "buffer"
) -> Snapshot | None:
    """The buffer ``name`` of ``buffer_class`` (a key of :data:`LAYOUTS`) now, or None if
    it does not exist (or has no configuration). Counters and history are in the class's
    unit (``Snapshot.unit``)."""
    if buffer_class not in LAYOUTS:
        raise ValueError(f"unknown buffer class {buffer_class!r}: one of {', '.join(LAYOUTS)}")
    if buffer_class != "buffer":
        return _class_snapshot(client, name, LAYOUTS[buffer_class], memory)
    from ..control.redis import ControlKeys

    keys, ctl = BufferKeys(name), ControlKeys(name)
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.meta)
    pipe.zcard(keys.order)
    pipe.exists(ctl.manager)
    pipe.smembers(ctl.workers)
    raw, length, manager, workers = pipe.execute()
    at = time.time()
    meta = {_text(k): _text(v) for k, v in raw.items()}
    if "capacity" not in meta:
        return None
    alive = 0
    if workers:
        pipe = client.pipeline(transaction=False)
        ranks = sorted(workers)
        for rank in ranks:
            pipe.exists(ctl.heartbeat(_int(rank)))
        alive = sum(1 for found in pipe.execute() if found)
    return Snapshot(
        name=name,
        at=at,
        capacity=_int(meta.get("capacity")),
        length=int(length),
        kind=meta.get("kind"),
        eviction=meta.get("eviction"),
        inserted=_int(meta.get("inserted")),
        evicted=_int(meta.get("evicted")),
        sampled=_int(meta.get("sampled")),
        memory_bytes=_memory(client, keys.all_keys()) if memory else None,
        last_insert=_float(meta.get("last_insert")),
        baseline=_float(meta.get("baseline_ema")),
        manager_running=bool(manager),
        workers_alive=alive,
        history=parse_history(meta),
        quarantined=_int(meta.get("quarantined")),
    )


@dataclass
class Histogram:
    """Counts of finite log-rewards in ``len(counts)`` equal bins from ``edges[0]`` to
    ``edges[-1]``, plus the number of ``-inf`` ones."""

    edges: list[float]
    counts: list[int]
    minus_inf: int


def log_reward_histogram(client: redis.Redis, name: str, bins: int = 20) -> Histogram:
    """Exact histogram of the buffer's log-rewards: ZCOUNT per bin (O(bins log n)). When
    every finite log-reward is the same value: one bin ``[value - 0.5, value + 0.5]``."""
    prio = BufferKeys(name).prio
    pipe = client.pipeline(transaction=False)
    pipe.zcount(prio, "-inf", "-inf")
    pipe.zrangebyscore(prio, "(-inf", "+inf", start=0, num=1, withscores=True)
    pipe.zrevrangebyscore(prio, "+inf", "(-inf", start=0, num=1, withscores=True)
    minus_inf, low, high = pipe.execute()
    if not low:
        return Histogram([], [], int(minus_inf))
    lo, hi = float(low[0][1]), float(high[0][1])
    if hi <= lo:
        # one value: one bin of width 1 centred on it, not a bar at the left edge of
        # an axis padded to the right
        count = client.zcount(prio, "(-inf", "+inf")
        return Histogram([lo - 0.5, lo + 0.5], [int(count)], int(minus_inf))
    edges = [lo + (hi - lo) * i / bins for i in range(bins + 1)]
    pipe = client.pipeline(transaction=False)
    for i in range(bins):
        upper = repr(edges[i + 1]) if i < bins - 1 else "+inf"
        pipe.zcount(prio, repr(edges[i]) if i else "(-inf", f"({upper}" if i < bins - 1 else upper)
    return Histogram(edges, [int(c) for c in pipe.execute()], int(minus_inf))


def uses_summary(client: redis.Redis, name: str, sample: int = 1000) -> dict[str, float] | None:
    """Mean and max times sampled over up to ``sample`` random items, when the buffer
    keeps per-item use counts (``rb:{name}:uses``); else None."""
    key = BufferKeys(name).uses
    try:
        pairs = client.hrandfield(key, sample, withvalues=True)
    except redis.exceptions.ResponseError:
        return None
    if not pairs:
        return None
    values = [_int(v) for v in pairs[1::2]]
    return {"items": len(values), "mean": sum(values) / len(values), "max": max(values)}


def versions_summary(client: redis.Redis, name: str) -> dict[str, float] | None:
    """Oldest and newest model version of the items, when the buffer keeps them."""
    key = BufferKeys(name).versions
    pipe = client.pipeline(transaction=False)
    pipe.zrange(key, 0, 0, withscores=True)
    pipe.zrange(key, -1, -1, withscores=True)
    oldest, newest = pipe.execute()
    if not oldest:
        return None
    return {"oldest": float(oldest[0][1]), "newest": float(newest[0][1])}


# -- Prometheus ----------------------------------------------------------------------


class BufferCollector:
    """A prometheus_client collector reading the buffers at each scrape.

    ``names`` empty means every buffer of every class (:func:`every_buffer`); a name
    given exports each class that has a buffer of that name (:func:`buffer_classes`).
    Every series has the labels ``buffer`` (the name) and ``class`` (a key of
    :data:`LAYOUTS`: buffer, sequence, episodes, fragments), so buffers of two classes
    under one name are two series. Gauges ``redisbuf_length``, ``redisbuf_capacity``,
    ``redisbuf_memory_bytes``, ``redisbuf_baseline_log_reward`` (ReplayBuffers with a
    baseline only); counters ``redisbuf_inserted_total``, ``redisbuf_evicted_total``,
    ``redisbuf_sampled_total``. Length, capacity and the counters are in the class's
    unit (:attr:`Layout.unit`: items, steps, episodes, chunks; the counters are the meta
    fields the layout names, which only a ReplayBuffer's ``clear()`` restarts).
    ``redisbuf_quarantined_total`` (ReplayBuffers only): records set aside because they
    do not decode (:mod:`redisbuf.buffers.quarantine`), which no ``clear()`` restarts.
    ``redisbuf_up`` (no labels) is 1 when Redis answered this scrape.
    """

    def __init__(self, client: redis.Redis, names: Sequence[str] = ()) -> None:
        self.client = client
        self.names = list(names)

    def describe(self) -> list[Any]:
        return []  # the buffers change between scrapes: no fixed description

    def _buffers(self) -> list[tuple[str, str]]:
        if not self.names:
            return every_buffer(self.client)
        return [(name, c) for name in self.names for c in buffer_classes(self.client, name)]

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        up = GaugeMetricFamily("redisbuf_up", "1 if Redis answered this scrape, else 0")
        try:
            snaps = [
                s
                for s in (
                    snapshot(self.client, name, buffer_class=c) for name, c in self._buffers()
                )
                if s is not None
            ]
        except redis.exceptions.RedisError:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        units = "in the class's unit: items, steps, episodes or chunks"
        gauges: dict[str, tuple[str, Callable[[Any], float | None]]] = {
            "length": (f"what the buffer holds ({units})", lambda s: s.length),
            "capacity": (f"the buffer's capacity ({units})", lambda s: s.capacity),
            "memory_bytes": ("bytes Redis uses for the buffer's keys", lambda s: s.memory_bytes),
            "baseline_log_reward": (
                "the manager's EMA baseline log-reward", lambda s: s.baseline
            ),
        }
        labels = ["buffer", "class"]
        family: Metric
        for metric, (doc, read) in gauges.items():
            family = GaugeMetricFamily(f"redisbuf_{metric}", doc, labels=labels)
            for snap in snaps:
                value = read(snap)
                if value is not None:
                    family.add_metric([snap.name, snap.buffer_class], float(value))
            yield family
        since = "since creation or a ReplayBuffer's last clear"
        counters = {
            "inserted": f"added {since} ({units})",
            "evicted": f"evicted {since} ({units})",
            "sampled": f"drawn {since} ({units})",
        }
        for metric, doc in counters.items():
            family = CounterMetricFamily(f"redisbuf_{metric}", doc, labels=labels)
            for snap in snaps:
                family.add_metric([snap.name, snap.buffer_class], float(getattr(snap, metric)))
            yield family
        family = CounterMetricFamily(
            "redisbuf_quarantined",
            "records set aside because they do not decode, since creation (items)",
            labels=labels,
        )
        for snap in snaps:
            if snap.buffer_class == "buffer":
                family.add_metric([snap.name, snap.buffer_class], float(snap.quarantined))
        yield family


def serve(client: redis.Redis, names: Sequence[str], port: int, addr: str = "0.0.0.0") -> Any:
    """Serve the metrics of ``names`` (all buffers of every class when empty) over HTTP
    at ``/metrics`` (see :class:`BufferCollector`);
    returns the HTTP server (``server_port`` is the port, useful with ``port=0``)."""
    from .._extras import require

    require("prometheus_client", "metrics", "redisbuf.ops.metrics.serve")
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(BufferCollector(client, names))
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return server
