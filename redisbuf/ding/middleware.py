"""DI-engine's buffer middleware (``ding.data.buffer.middleware``), with their state on the
server so that every process sharing a buffer applies the same rule.

- ``PriorityExperienceReplay``: redisbuf's PER (``PERSampler``): priorities, the running
  max priority, the IS exponent's annealing (counted in ``rb:{name}:ding``) are the
  buffer's; IS weights and updates as DI-engine computes them.
- ``use_time_check``: the buffer's ``max_use`` (the draw that brings an item's use count
  to ``max_use`` returns it and removes it), with ``meta["use_count"]`` from the server.
- ``staleness_check``: the buffer's ``max_staleness`` over model versions: pushes carry
  ``meta["train_iter_data_collected"]``, each sample's ``train_iter_sample_data`` becomes
  the current version and items more than ``max_staleness`` behind are removed.
- ``sample_range_view``, ``clone_object``, ``group_sample``, ``padding``: in the caller's
  process, as DI-engine's (``clone_object`` has nothing to do: every item is stored as
  bytes and every read decodes new objects).
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Callable
from typing import Any

from ..errors import EmptyBufferError
from ._compat import per_base
from ._shared import SESSION, id_of, index_of
from .buffer import BufferedData

__all__ = [
    "PriorityExperienceReplay", "clone_object", "group_sample", "padding",
    "sample_range_view", "staleness_check", "use_time_check",
]

#: added to every updated priority (DI-engine's epsilon)
UPDATE_EPS = 1e-5


def _each(sampled: list[Any]) -> list[BufferedData]:
    """The BufferedData of a sample, flat (groups of a groupby sample unrolled)."""
    out: list[BufferedData] = []
    for entry in sampled:
        out.extend(entry if isinstance(entry, list) else [entry])
    return out


def _shared_of(buffer: Any) -> Any:
    shared = getattr(buffer, "shared", None)
    if shared is None:
        raise TypeError(f"{type(buffer).__name__} is not a redisbuf.ding buffer")
    return shared


def _finite_or_none(value: float, name: str) -> int | None:
    if value == float("inf"):
        return None
    if not float(value).is_integer() or value < 0:
        raise ValueError(f"{name} must be a non-negative integer or inf, got {value!r}")
    return int(value)


def clone_object() -> Callable[..., Any]:
    """Freeze pushed objects and return copies on sample (DI-engine's ``clone_object``):
    a redisbuf buffer always does, so the middleware passes every call through."""

    def _clone_object(action: str, chain: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return chain(*args, **kwargs)

    return _clone_object


def use_time_check(buffer_: Any, max_use: int | float = float("inf")) -> Callable[..., Any]:
    """Remove an item once it has been sampled ``max_use`` times (DI-engine's
    ``use_time_check``), counted on the server across processes: the draw that brings its
    use count to ``max_use`` returns it and removes it. Sampled items' meta gets
    ``use_count``, the item's count on the server right after the draw. Uses are
    counted by draws; ``sample(indices=...)`` reads without using.

    Use it before the buffer's first push (redisbuf fixes ``max_use`` then);
    ``ConfigMismatchError`` otherwise, unless the buffer has that ``max_use`` already.

    Args:
        buffer_: the buffer.
        max_use: the uses after which an item goes (``inf``: never).

    Returns:
        The middleware.
    """
    shared = _shared_of(buffer_)
    limit = _finite_or_none(max_use, "max_use")
    if limit is not None:
        if limit < 1:
            raise ValueError(f"max_use must be at least 1, got {max_use!r}")
        shared.configure(max_use=limit)

    def sample(chain: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        sampled = chain(*args, **kwargs)
        items = _each(sampled)
        if items:
            ids = [id_of(item.index) for item in items]
            members = [index_of(i).encode() for i in ids if i is not None]
            counts = dict(zip(members, shared.client.hmget(shared.keys.uses, members),
                              strict=True))
            for item in items:
                count = counts.get(item.index.encode())
                item.meta["use_count"] = int(count) if count is not None else (
                    limit if limit is not None else 0)
        return sampled

    def _use_time_check(action: str, chain: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if action == "sample":
            return sample(chain, *args, **kwargs)
        return chain(*args, **kwargs)

    return _use_time_check


def staleness_check(buffer_: Any, max_staleness: int | float = float("inf")) -> Callable[..., Any]:
    """Remove items collected more than ``max_staleness`` train iterations before the
    sampling one (DI-engine's ``staleness_check``), on the server for every process.

    Pushes must carry ``meta={"train_iter_data_collected": it}`` (AssertionError
    otherwise), stored as the item's model version; ``sample(...,
    train_iter_sample_data=it)`` makes ``it`` the buffer's current version, which removes
    every item whose staleness ``it - collected`` exceeds ``max_staleness``, then samples
    and sets ``meta["staleness"]`` of the sampled items. A push already that stale is
    refused (DI-engine would keep it until the next sample removes it).

    Args:
        buffer_: the buffer.
        max_staleness: the largest staleness kept (``inf``: any).

    Returns:
        The middleware.
    """
    shared = _shared_of(buffer_)
    limit = _finite_or_none(max_staleness, "max_staleness")
    if limit is not None:
        shared.configure(max_staleness=limit)

    def push(chain: Callable[..., Any], data: Any, *args: Any, **kwargs: Any) -> Any:
        assert "meta" in kwargs and "train_iter_data_collected" in kwargs["meta"], (
            "staleness_check middleware must push data with "
            "meta={'train_iter_data_collected': <iter>}")
        return chain(data, *args, **kwargs)

    def sample(chain: Callable[..., Any], train_iter_sample_data: int, *args: Any,
               **kwargs: Any) -> Any:
        if limit is not None:
            shared.engine.update_model_version(SESSION, int(train_iter_sample_data))
        sampled = chain(*args, **kwargs)
        for item in _each(sampled):
            collected = item.meta.get("train_iter_data_collected")
            if collected is not None:
                item.meta["staleness"] = train_iter_sample_data - collected
        return sampled

    def _staleness_check(action: str, chain: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if action == "push":
            return push(chain, *args, **kwargs)
        if action == "sample":
            return sample(chain, *args, **kwargs)
        return chain(*args, **kwargs)

    return _staleness_check


def sample_range_view(buffer_: Any, start: int | None = None, end: int | None = None
                      ) -> Callable[..., Any]:
    """Restrict every sample to positions ``[start, end)`` (DI-engine's
    ``sample_range_view``): a negative bound counts back from the buffer's ``size`` (its
    capacity, not its length), and the sample's other arguments are dropped, as there.

    Args:
        buffer_: the buffer.
        start: the first position.
        end: one past the last position.

    Returns:
        The middleware.
    """
    assert start is not None or end is not None
    if start and start < 0:
        start = buffer_.size + start
    if end and end < 0:
        end = buffer_.size + end
    sample_range = slice(start, end)

    def _sample_range_view(action: str, chain: Callable[..., Any], *args: Any,
                           **kwargs: Any) -> Any:
        if action == "sample":
            return chain(*args, sample_range=sample_range)
        return chain(*args, **kwargs)

    return _sample_range_view


def group_sample(size_in_group: int, ordered_in_group: bool = True,
                 max_use_in_group: bool = True) -> Callable[..., Any]:
    """Cut each group of a ``groupby`` sample to ``size_in_group`` items (DI-engine's
    ``group_sample``): consecutive ones from a random start (``ordered_in_group``; with
    ``max_use_in_group`` the start leaves ``size_in_group`` items where it can), else a
    random subset.

    Args:
        size_in_group: items kept per group.
        ordered_in_group: keep consecutive items in order.
        max_use_in_group: choose starts that keep as many items as possible.

    Returns:
        The middleware.
    """

    def sample(chain: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("groupby"):
            raise Exception("Group sample must be used when the `groupby` parameter is specified.")
        sampled = chain(*args, **kwargs)
        for position, group in enumerate(sampled):
            if ordered_in_group:
                end = (max(0, len(group) - size_in_group) + 1 if max_use_in_group
                       else len(group))
                start = random.choice(range(end))
                sampled[position] = group[start : start + size_in_group]
            else:
                sampled[position] = random.sample(group, k=size_in_group)
        return sampled

    def _group_sample(action: str, chain: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if action == "sample":
            return sample(chain, *args, **kwargs)
        return chain(*args, **kwargs)

    return _group_sample


def padding(policy: str = "random") -> Callable[..., Any]:
    """Fill every group of a ``groupby`` sample to the longest one's length (DI-engine's
    ``padding``): with copies of random items of the group (``"random"``) or with empty
    ``BufferedData(None, None, None)`` (``"none"``).

    Args:
        policy: ``"random"`` or ``"none"``.

    Returns:
        The middleware.
    """

    def sample(chain: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        sampled = chain(*args, **kwargs)
        if len(sampled) == 0 or isinstance(sampled[0], BufferedData):
            return sampled
        longest = len(max(sampled, key=len))
        for group in sampled:
            for _ in range(longest - len(group)):
                if policy == "random":
                    group.append(copy.deepcopy(random.choice(group)))
                elif policy == "none":
                    group.append(BufferedData(data=None, index=None, meta=None))  # type: ignore[arg-type]
        return sampled

    def _padding(action: str, chain: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if action == "sample":
            return sample(chain, *args, **kwargs)
        return chain(*args, **kwargs)

    return _padding


class PriorityExperienceReplay(per_base()):  # type: ignore[misc]
    """Prioritized experience replay (DI-engine's ``PriorityExperienceReplay``) on the
    buffer's PER, shared by every process.

    A pushed item's priority is ``meta["priority"]``, or (``meta`` None) a ``priority``
    key popped from a dict ``data``, else the running max priority (1.0 at first and
    after ``clear``; raised by updates only). An item is drawn with probability
    ``priority^priority_power_factor / sum``, independently per draw (DI-engine draws one
    per equal slice of the mass: the same expected counts). With ``IS_weight`` each
    sampled item's ``meta["priority_IS"]`` (and ``data["priority_IS"]``, a 1-element
    float tensor) is ``(N P(i))^-b / max_j (N P(j))^-b``, ``b`` the IS exponent, which
    starts at ``IS_weight_power_factor`` and grows by ``(1 - it) /
    IS_weight_anneal_train_iter`` per sample of any process, up to 1. ``update(index,
    data, meta)`` sets the priority to ``meta["priority"] + 1e-5``.

    Args:
        buffer: the buffer.
        IS_weight: compute importance-sampling weights.
        priority_power_factor: the exponent of priorities (alpha); the buffer's, fixed
            when PER is first turned on.
        IS_weight_power_factor: the IS exponent at the start (beta).
        IS_weight_anneal_train_iter: samples over which it grows to 1.
    """

    def __init__(self, buffer: Any, IS_weight: bool = True, priority_power_factor: float = 0.6,  # noqa: N803
                 IS_weight_power_factor: float = 0.4,  # noqa: N803
                 IS_weight_anneal_train_iter: int = int(1e5)) -> None:  # noqa: N803
        self.buffer = buffer
        self.shared = _shared_of(buffer)
        self.buffer_size = buffer.size
        self.IS_weight = IS_weight
        self.priority_power_factor = priority_power_factor
        self.initial_IS_weight_power_factor = IS_weight_power_factor
        self.IS_weight_anneal_train_iter = IS_weight_anneal_train_iter
        if IS_weight:
            self.delta_anneal = (1 - IS_weight_power_factor) / IS_weight_anneal_train_iter
        self.shared.configure(alpha=float(priority_power_factor))

    # -- state on the server ----------------------------------------------------------

    @property
    def IS_weight_power_factor(self) -> float:  # noqa: N802
        """The IS exponent now: its start plus the annealing of every sample so far."""
        count = int(self.shared.client.hget(self.shared.state_key, "per_samples") or 0)
        return self._exponent(count)

    def _exponent(self, samples: int) -> float:
        if not self.IS_weight:
            return self.initial_IS_weight_power_factor
        return min(1.0, self.initial_IS_weight_power_factor + self.delta_anneal * samples)

    @property
    def max_priority(self) -> float:
        """The priority a pushed item without one gets (the buffer's running max)."""
        meta = self.shared.client.hmget(self.shared.keys.meta, "per_max", "per_initial")
        values = [float(v) for v in meta if v is not None]
        return max(values, default=1.0)

    @property
    def buffer_idx(self) -> dict[int, str]:
        """``meta["priority_idx"]`` (the item id) -> index, for every stored item."""
        members = self.shared.client.zrange(self.shared.keys.order, 0, -1)
        return {int(m): m.decode() for m in members}

    # -- actions ----------------------------------------------------------------------

    def push(self, chain: Callable[..., Any], data: Any, meta: dict | None = None,
             *args: Any, **kwargs: Any) -> BufferedData:
        if meta is None:
            meta = {"priority": data.pop("priority")} if "priority" in data else {}
        buffered = chain(data, *args, meta=meta, **kwargs)
        if buffered is not None and buffered.index is not None:
            buffered.meta["priority_idx"] = id_of(buffered.index)
        return buffered

    def sample(self, chain: Callable[..., Any], size: int, *args: Any, **kwargs: Any) -> Any:
        shared = self.shared
        engine = shared.per()
        try:
            info = engine.sample_with_info(size)
        except EmptyBufferError:
            raise ValueError(f"There are less than {size} records/groups in buffer(0)") from None
        ids = info.ids.tolist()
        shared.remember(ids, info.records)
        shared.local.drawn = dict(zip(ids, info.records or [], strict=False))
        try:
            data = chain(*args, indices=[index_of(i) for i in ids], **kwargs)
        finally:
            shared.local.drawn = None
        ratio = dict(zip(ids, info.weights.tolist(), strict=True))  # min mass / mass (beta 1)
        drawn_priority = dict(zip(ids, info.priorities.tolist(), strict=True))
        for item in data:
            if "priority" not in item.meta:  # pushed without one: what the server gave it
                item.meta["priority"] = drawn_priority.get(id_of(item.index))
            item.meta["priority_idx"] = id_of(item.index)
        if self.IS_weight:
            samples = int(shared.client.hincrby(shared.state_key, "per_samples", 1))
            exponent = self._exponent(samples - 1)
            import torch

            for item in data:
                weight = ratio[id_of(item.index)] ** exponent
                item.meta["priority_IS"] = weight
                item.data["priority_IS"] = torch.as_tensor([weight]).float()
        return data

    def update(self, chain: Callable[..., Any], index: str, data: Any, meta: Any,
               *args: Any, **kwargs: Any) -> bool:
        local = self.shared.local
        priority = meta.get("priority") if isinstance(meta, dict) else None
        if isinstance(priority, (int, float)) and priority >= 0:
            # the buffer's own update sets it with the record, in the same command
            local.priority = priority + UPDATE_EPS
        try:
            done = chain(index, data, meta, *args, **kwargs)
        finally:
            pending = local.__dict__.pop("priority", None)
        if done:
            assert meta is not None, "Please indicate dict-type meta in priority update"
            priority = meta["priority"]
            assert priority >= 0, f"new_priority should greater than 0, but found {priority}"
            if pending is not None:  # not set with the record (a middleware in between)
                self.shared.per().update_priority([id_of(index)], [priority + UPDATE_EPS])
        return done

    def delete(self, chain: Callable[..., Any], index: Any, *args: Any, **kwargs: Any) -> Any:
        return chain(index, *args, **kwargs)

    def clear(self, chain: Callable[..., Any]) -> None:
        chain()

    def state_dict(self) -> dict[str, Any]:
        """The state DI-engine's middleware would save: the running max priority and the
        IS exponent now (the priorities themselves are the buffer's: ``save_data``)."""
        return {"max_priority": self.max_priority,
                "IS_weight_power_factor": self.IS_weight_power_factor}

    def load_state_dict(self, _state_dict: dict[str, Any], deepcopy: bool = False) -> None:
        """Set the IS exponent (for every process) to the saved one; the running max
        comes with the buffer's items (``load_data``).

        Args:
            _state_dict: what :meth:`state_dict` returned.
            deepcopy: unused (DI-engine's argument).
        """
        exponent = _state_dict.get("IS_weight_power_factor")
        if exponent is not None and self.IS_weight and self.delta_anneal > 0:
            samples = max(0, math.ceil((exponent - self.initial_IS_weight_power_factor)
                                       / self.delta_anneal - 1e-9))
            self.shared.client.hset(self.shared.state_key, "per_samples", samples)

    def __call__(self, action: str, chain: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if action in ("push", "sample", "update", "delete", "clear"):
            return getattr(self, action)(chain, *args, **kwargs)
        return chain(*args, **kwargs)

