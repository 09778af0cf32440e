"""How a Reverb table maps onto redisbuf's parts: a
:class:`~redisbuf.buffers.replay.ReplayBuffer` whose items reference the steps of the
server's :class:`~redisbuf.buffers.steps.StepStore`, with the sampler, remover, rate
limiter and ``max_use`` that play Reverb's, and the table's description (selectors,
signature, ``max_times_sampled``) kept with the store for every process.

================================  ===========================================================
Reverb                            redisbuf
================================  ===========================================================
sampler ``Uniform()``             ``UniformSampler(replacement=True)`` (independent draws)
sampler ``Prioritized(e)``        ``PERSampler(alpha=e, eps=0)``
sampler ``Fifo()``, ``Lifo()``    ``FifoSampler`` / ``LifoSampler(successive=True,
                                  admits=True)`` (the limiter asked in the draw's script)
sampler ``MaxHeap()``, ...        ``MaxHeapSampler(by="priority", successive=True,
                                  admits=True)``, ...
remover ``Fifo()`` ...            ``FifoRemover()``, ``LifoRemover()``, ``UniformRemover()``,
                                  ``PrioritizedRemover(e)``, ``MaxHeapRemover()``, ...
``max_times_sampled``             ``max_use`` (``< 1``: none)
``rate_limiter``                  its ``internal_limiter``, enforced for every process
priorities                        PER priorities (every table keeps them)
================================  ===========================================================
"""

from __future__ import annotations

from typing import Any

from ..buffers.replay import ReplayBuffer
from ..buffers.steps import StepStore
from ..sampling.removers import (
    FifoRemover,
    LifoRemover,
    MaxHeapRemover,
    MinHeapRemover,
    PrioritizedRemover,
    Remover,
    UniformRemover,
)
from ..sampling.samplers import PERSampler, UniformSampler
from ..sampling.selectors import FifoSampler, LifoSampler, MaxHeapSampler, MinHeapSampler
from . import pybind, tensor_spec
from .reverb_types import (
    HeapOptions,
    KeyDistributionOptions,
    PrioritizedOptions,
    RateLimiterCallStats,
    RateLimiterInfo,
    TableInfo,
)

#: The step store of every redisbuf.reverb table on a server.
STORE = "reverb"


def selector_json(selector: pybind.ItemSelector) -> dict[str, Any]:
    if not isinstance(selector, pybind.ItemSelector):
        raise TypeError(f"a selector of redisbuf.reverb.selectors is needed, got {selector!r}")
    out: dict[str, Any] = {"kind": selector.kind}
    if isinstance(selector, pybind.PrioritizedSelector):
        out["priority_exponent"] = selector.priority_exponent
    if isinstance(selector, pybind.HeapSelector):
        out["min_heap"] = selector.min_heap
    return out


def selector_of(data: dict[str, Any]) -> pybind.ItemSelector:
    kind = data["kind"]
    if kind == "prioritized":
        return pybind.PrioritizedSelector(data["priority_exponent"])
    if kind == "heap":
        return pybind.HeapSelector(data["min_heap"])
    return {"fifo": pybind.FifoSelector, "lifo": pybind.LifoSelector,
            "uniform": pybind.UniformSelector}[kind]()


def options_of(selector: pybind.ItemSelector) -> KeyDistributionOptions:
    """The ``KeyDistributionOptions`` Reverb reports for a selector."""
    deterministic = selector.is_deterministic
    if isinstance(selector, pybind.PrioritizedSelector):
        return KeyDistributionOptions(prioritized=PrioritizedOptions(
            priority_exponent=selector.priority_exponent), is_deterministic=deterministic)
    if isinstance(selector, pybind.HeapSelector):
        return KeyDistributionOptions(heap=HeapOptions(min_heap=selector.min_heap),
                                      is_deterministic=deterministic)
    return KeyDistributionOptions(**{selector.kind: True}, is_deterministic=deterministic)


def sampler_of(selector: pybind.ItemSelector) -> Any:
    """The redisbuf sampler that draws as ``selector`` samples."""
    if isinstance(selector, pybind.PrioritizedSelector):
        return PERSampler(alpha=selector.priority_exponent, eps=0.0, initial_priority=1.0)
    if isinstance(selector, pybind.HeapSelector):
        heap = MinHeapSampler if selector.min_heap else MaxHeapSampler
        return heap(by="priority", successive=True, admits=True)
    if isinstance(selector, pybind.FifoSelector):
        return FifoSampler(successive=True, admits=True)
    if isinstance(selector, pybind.LifoSelector):
        return LifoSampler(successive=True, admits=True)
    return UniformSampler(replacement=True)


def remover_of(selector: pybind.ItemSelector) -> Remover:
    """The redisbuf remover that removes as ``selector`` does."""
    if isinstance(selector, pybind.PrioritizedSelector):
        return PrioritizedRemover(selector.priority_exponent)
    if isinstance(selector, pybind.HeapSelector):
        return MinHeapRemover() if selector.min_heap else MaxHeapRemover()
    if isinstance(selector, pybind.LifoSelector):
        return LifoRemover()
    if isinstance(selector, pybind.UniformSelector):
        return UniformRemover()
    return FifoRemover()


def _per_sampler(description: dict[str, Any]) -> PERSampler:
    """The PER settings every process gives the table's buffer (its priorities)."""
    sampler = description["sampler"]
    alpha = sampler["priority_exponent"] if sampler["kind"] == "prioritized" else 1.0
    return PERSampler(alpha=alpha, eps=0.0, initial_priority=1.0)


def create(store: StepStore, description: dict[str, Any], limiter: Any) -> ReplayBuffer:
    """Make (or open, checking its configuration) the buffer of a table described by
    ``description`` (see :func:`describe`), and keep the description with the store."""
    max_use = description["max_times_sampled"]
    buffer = store.table(
        description["name"], capacity=description["max_size"],
        sampler=_per_sampler(description),
        remover=remover_of(selector_of(description["remover"])),
        rate_limiter=limiter, max_use=max_use if max_use >= 1 else None)
    store.describe(description["name"], description)
    _use_sampler(buffer, description)
    return buffer


def open_table(store: StepStore, name: str, description: dict[str, Any]) -> ReplayBuffer:
    """This process's object of an existing table's buffer, drawing as its sampler."""
    buffer = store.table(name, sampler=_per_sampler(description))
    _use_sampler(buffer, description)
    return buffer


def _use_sampler(buffer: ReplayBuffer, description: dict[str, Any]) -> None:
    # the buffer keeps PER priorities for every table; this process draws as the table's
    # sampler says (a per-process setting of the buffer)
    sampler = sampler_of(selector_of(description["sampler"]))
    if not isinstance(sampler, PERSampler):
        buffer.sampler = sampler
        sampler.prepare(buffer.view)


def describe(name: str, sampler: pybind.ItemSelector, remover: pybind.ItemSelector,
             max_size: int, max_times_sampled: int, limiter: Any, signature: Any
             ) -> dict[str, Any]:
    """A table's description as JSON data."""
    return {
        "name": name, "sampler": selector_json(sampler), "remover": selector_json(remover),
        "max_size": int(max_size), "max_times_sampled": int(max_times_sampled),
        "rate_limiter": [limiter.samples_per_insert, limiter.min_size_to_sample,
                         limiter.min_diff, limiter.max_diff],
        "signature": None if signature is None else tensor_spec.to_json(signature),
    }


def signature_of(description: dict[str, Any]) -> Any:
    data = description.get("signature")
    return None if data is None else tensor_spec.from_json(data)


def info(description: dict[str, Any], store: StepStore | None = None,
         buffer: ReplayBuffer | None = None) -> TableInfo:
    """The TableInfo of a table: its configuration, and with ``buffer`` its state."""
    spi, min_size, min_diff, max_diff = description["rate_limiter"]
    meta: dict[bytes, bytes] = {}
    size = 0
    if buffer is not None:
        pipe = buffer.client.pipeline(transaction=False)
        pipe.hmget(buffer.keys.meta, "rl_inserts", "rl_samples", "sampled_unique")
        pipe.zcard(buffer.keys.order)
        values, size = pipe.execute()
        meta = dict(zip((b"rl_inserts", b"rl_samples", b"sampled_unique"), values,
                        strict=True))
    limiter = RateLimiterInfo(
        samples_per_insert=spi, min_size_to_sample=min_size, min_diff=min_diff,
        max_diff=max_diff,
        insert_stats=RateLimiterCallStats(completed=int(meta.get(b"rl_inserts") or 0)),
        sample_stats=RateLimiterCallStats(completed=int(meta.get(b"rl_samples") or 0)))
    count = None
    inserted = 0
    if store is not None and buffer is not None:
        inserted = store.episodes_inserted(description["name"])

        def count() -> int:
            return store.episodes_present(buffer)

    return TableInfo(
        name=description["name"],
        sampler_options=options_of(selector_of(description["sampler"])),
        remover_options=options_of(selector_of(description["remover"])),
        max_size=description["max_size"], max_times_sampled=description["max_times_sampled"],
        rate_limiter_info=limiter, signature=signature_of(description),
        current_size=int(size), num_unique_samples=int(meta.get(b"sampled_unique") or 0),
        episodes_inserted=inserted, count_episodes=count)


__all__ = ["STORE", "create", "describe", "info", "open_table", "options_of", "remover_of",
           "sampler_of", "selector_json", "selector_of", "signature_of"]
