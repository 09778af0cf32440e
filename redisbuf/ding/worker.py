"""DI-engine's ``ding.worker.replay_buffer`` (the seed's ``IBuffer``, ``NaiveReplayBuffer``,
``AdvancedReplayBuffer``, ``EpisodeReplayBuffer``, ``create_buffer``, ``get_buffer_cls``)
on redisbuf buffers shared by URL and name.

A buffer holds ``replay_buffer_size`` items, the oldest dropped first. Items are any
nest (:mod:`redisbuf.store.nest`); every sample returns new copies, so ``deepcopy`` has
nothing left to do. The advanced buffer's priorities, use counts, staleness and the
annealing of ``beta`` are the server's: every process sharing the buffer sees them.
"""

from __future__ import annotations

import copy
import logging
import math
import os
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np

from ..errors import EmptyBufferError
from ..store import nest
from ..store.keys import format_id
from ._shared import SESSION, Shared, number, use_limit
from .config import EasyDict, merged
from .local_parts import BufferMonitor, ThruputRule, UsedDataRemover

logger = logging.getLogger("redisbuf.ding")

__all__ = [
    "AdvancedReplayBuffer", "EpisodeReplayBuffer", "IBuffer", "NaiveReplayBuffer",
    "UsedDataRemover", "create_buffer", "get_buffer_cls",
]


class IBuffer:
    """DI-engine's buffer interface: ``push``, ``update``, ``sample``, ``clear``, ``count``,
    ``state_dict``, ``load_state_dict``, ``save_data``, ``load_data``, ``default_config``."""

    config: ClassVar[dict[str, Any]] = {}

    @classmethod
    def default_config(cls) -> EasyDict:
        """The buffer's default config (a copy), ``cfg_type`` set to the class name + ``Dict``.

        Returns:
            The config.
        """
        cfg = EasyDict(copy.deepcopy(cls.config))
        cfg.cfg_type = cls.__name__ + "Dict"
        return cfg

    def push(self, data: Any, cur_collector_envstep: int) -> None:
        raise NotImplementedError

    def update(self, info: dict[str, list[Any]]) -> None:
        raise NotImplementedError

    def sample(self, batch_size: int, cur_learner_iter: int) -> list[Any] | None:
        raise NotImplementedError

    def clear(self) -> None:
        raise NotImplementedError

    def count(self) -> int:
        raise NotImplementedError

    def save_data(self, file_name: str) -> None:
        raise NotImplementedError

    def load_data(self, file_name: str) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def load_state_dict(self, _state_dict: dict[str, Any]) -> None:
        raise NotImplementedError


class NaiveReplayBuffer(IBuffer):
    """DI-engine's ``NaiveReplayBuffer``: ``replay_buffer_size`` items, uniform sampling.

    Args:
        cfg: the config (a mapping; missing keys take :meth:`default_config`'s values).
        tb_logger: an optional TensorBoard ``SummaryWriter`` for the monitor.
        exp_name: the experiment's name.
        instance_name: the buffer's name in logs (and in the advanced buffer's
            ``replay_unique_id``).
        url: a Redis URL or client (``None``: ``$REDISBUF_URL`` or the private server).
        name: the redisbuf buffer's name to share it by (``None``: a private one).

    Examples:
        >>> import fakeredis
        >>> from redisbuf.ding import NaiveReplayBuffer
        >>> cfg = NaiveReplayBuffer.default_config()
        >>> cfg.replay_buffer_size = 4
        >>> buffer = NaiveReplayBuffer(cfg, url=fakeredis.FakeRedis(), name="demo")
        >>> buffer.push([{"obs": i} for i in range(6)], cur_collector_envstep=0)
        >>> buffer.count(), sorted(d["obs"] for d in buffer.sample(4, cur_learner_iter=0))
        (4, [2, 3, 4, 5])
    """

    config: ClassVar[dict[str, Any]] = dict(
        type="naive",
        replay_buffer_size=10000,
        deepcopy=False,
        enable_track_used_data=False,
        periodic_thruput_seconds=60,
    )

    def __init__(self, cfg: Mapping[str, Any] | None = None, tb_logger: Any = None,
                 exp_name: str | None = "default_experiment",
                 instance_name: str | None = "buffer", *, url: Any = None,
                 name: str | None = None) -> None:
        self._cfg = merged(self.default_config(), cfg)
        self._exp_name, self._instance_name = exp_name, instance_name
        self._replay_buffer_size = int(self._cfg.replay_buffer_size)
        self._deepcopy = self._cfg.deepcopy
        self._end_flag = False
        self.shared = Shared(self._replay_buffer_size, url, name)
        self._tb_logger = tb_logger
        self._enable_track_used_data = bool(self._cfg.enable_track_used_data)
        if self._enable_track_used_data:
            self._used_data_remover = UsedDataRemover()
        self._monitor = BufferMonitor(str(instance_name), 5, 200,
                                 float(self._cfg.get("periodic_thruput_seconds", 60)), tb_logger)

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Start the used-data remover's thread (``enable_track_used_data``)."""
        if self._enable_track_used_data:
            self._used_data_remover.start()

    def close(self) -> None:
        """Clear the buffer (for every process sharing it, as DI-engine's close clears
        its own), stop the remover, flush and close the TensorBoard logger."""
        if self._end_flag:
            return
        self._end_flag = True
        self.clear()
        if self._enable_track_used_data:
            self._used_data_remover.close()
        if self._tb_logger is not None:
            self._tb_logger.flush()
            self._tb_logger.close()

    # -- writing ------------------------------------------------------------------------

    def push(self, data: Any, cur_collector_envstep: int = -1) -> None:
        """Push one item, or each of a list of items, the oldest dropped beyond
        ``replay_buffer_size``.

        Args:
            data: an item or a list of items.
            cur_collector_envstep: the collector's env step (for the monitor).
        """
        items = data if isinstance(data, list) else [data]
        self._store(items, None)

    def _store(self, items: list[Any], priorities: list[float | None] | None,
               versions: list[int | None] | None = None) -> list[int]:
        """Add ``items`` (bounded batches, grouped by model version), the files of the
        items they evict queued for removal. Returns the new ids."""
        items = [item for item in items if item is not None]
        if not items:
            return []
        engine = self.shared.engine
        ids: list[int] = []
        start = 0
        while start < len(items):
            stop = min(len(items), start + 512)
            version = None if versions is None else versions[start]
            if versions is not None:  # one model version per add
                stop = next((i for i in range(start + 1, stop) if versions[i] != version), stop)
            evicted = self._leaving(stop - start) if self._enable_track_used_data else []
            kwargs: dict[str, Any] = {}
            if version is not None:
                kwargs["model_version"] = version
            batch = items[start:stop]
            if priorities is not None and any(p is not None for p in priorities[start:stop]):
                default = self._default_priority()
                given = [default if p is None else float(p) for p in priorities[start:stop]]
                result = engine.add(batch, priorities=given, raise_running_max=False, **kwargs)
            else:
                result = engine.add(batch, **kwargs)
            ids += result.ids.tolist()
            for gone in evicted:
                self._used_data_remover.add_used_data(gone)
            self._monitor.counts["pushed_in"] += len(batch)
            start = stop
        self._monitor.tick(self.count())
        return ids

    def _leaving(self, adding: int) -> list[Any]:
        """The items an add of ``adding`` will evict (the oldest beyond capacity)."""
        shared = self.shared
        over = len(shared.engine) + adding - self._replay_buffer_size
        if over <= 0:
            return []
        members = shared.client.zrange(shared.keys.order, 0, over - 1)
        return [nest.decode_nest(blob) for blob in shared.engine.records(
            [int(m) for m in members]) if blob is not None]

    def _default_priority(self) -> float:
        return 1.0

    # -- reading ------------------------------------------------------------------------

    def sample(self, size: int, cur_learner_iter: int, sample_range: slice | None = None,
               replace: bool = False) -> list[Any] | None:
        """Draw ``size`` items uniformly (``replace``: with replacement; ``sample_range``:
        among the items at those positions of the insertion order, oldest first,
        negative bounds counting from the newest); ``None`` when the buffer is empty or
        holds fewer than ``size`` without ``replace``.

        Args:
            size: how many items.
            cur_learner_iter: the learner's iteration (unused, as in DI-engine).
            sample_range: a slice of positions.
            replace: draw with replacement.

        Returns:
            The items, or ``None``.
        """
        if size == 0:
            return []
        count = self.count()
        if count == 0:
            logger.info("The buffer is empty")
            return None
        if count < size and not replace:
            logger.info("No enough elements for sampling without replacement (expect: %d / "
                        "current: %d)", size, count)
            return None
        try:
            info = self.shared.engine.sample_with_info(size, replacement=bool(replace),
                                                       sample_range=sample_range)
        except EmptyBufferError:
            return None
        self._monitor.counts["sampled_out"] += size
        return list(info.batch)

    def update(self, info: dict[str, Any]) -> None:
        """Nothing to update in a naive buffer (DI-engine's warning)."""
        logger.warning("[BUFFER WARNING] Naive Buffer does not need to update any info, "
                       "but `update` method is preserved for compatibility.")

    def clear(self) -> None:
        """Remove every item (for every process sharing the buffer); the push count
        starts again from 0."""
        if self._enable_track_used_data:
            for data in self._all():
                self._used_data_remover.add_used_data(data)
        self.shared.engine.clear()

    def count(self) -> int:
        """The number of items."""
        return len(self.shared.engine)

    def _all(self) -> list[Any]:
        shared = self.shared
        members = shared.client.zrange(shared.keys.order, 0, -1)
        return [nest.decode_nest(blob) for blob in shared.engine.records(
            [int(m) for m in members]) if blob is not None]

    # -- state --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """``data`` (every item, oldest first), ``valid_count`` and ``push_count``.

        Returns:
            The state.
        """
        return {"data": self._all(), "valid_count": self.count(), "push_count": self.push_count}

    def load_state_dict(self, _state_dict: dict[str, Any], deepcopy: bool = False) -> None:
        """Push the items of a state's ``data`` (after clearing the buffer when the state
        is a whole one from :meth:`state_dict`, not ``{"data": [...]}`` alone).

        Args:
            _state_dict: the state.
            deepcopy: unused: items are always copied.
        """
        assert "data" in _state_dict
        if set(_state_dict) != {"data"}:
            self.shared.engine.clear()
        self.push(list(_state_dict["data"]), 0)

    def save_data(self, file_name: str) -> None:
        """Write every item to ``file_name`` (one nest record: the list of the items).

        Args:
            file_name: the file.
        """
        folder = os.path.dirname(file_name)
        if folder and not os.path.exists(folder):
            os.makedirs(folder)
        with open(file_name, "wb") as f:
            f.write(nest.encode_nest(self._all()))

    def load_data(self, file_name: str) -> None:
        """Push the items of a file :meth:`save_data` wrote.

        Args:
            file_name: the file.
        """
        with open(file_name, "rb") as f:
            self.push(list(nest.decode_nest(f.read())), 0)

    @property
    def replay_buffer_size(self) -> int:
        """The most items kept."""
        return self._replay_buffer_size

    @property
    def push_count(self) -> int:
        """Items pushed since the buffer was made or last cleared (by every process)."""
        return int(self.shared.client.hget(self.shared.keys.meta, "inserted") or 0)


class EpisodeReplayBuffer(NaiveReplayBuffer):
    """DI-engine's ``EpisodeReplayBuffer``: a naive buffer whose items are whole episodes
    (lists of transitions)."""

    @property
    def episode_len(self) -> list[int]:
        """The length of every stored episode, oldest first."""
        return [len(episode) for episode in self._all()]


def _collect_iter(data: Any) -> int | None:
    value = data.get("collect_iter") if isinstance(data, dict) else None
    if isinstance(value, list):
        value = min(value) if value else None
    if value is None:
        return None
    return int(value)


class AdvancedReplayBuffer(NaiveReplayBuffer):
    """DI-engine's ``AdvancedReplayBuffer``: prioritized experience replay, use counts
    (``max_use``), staleness (``max_staleness``), throughput control and monitoring.

    Items are dicts (others are refused and logged, as DI-engine's data check). A pushed
    item's priority is its ``priority`` key, else (missing or ``None``) the running max
    priority (1.0 at first and after ``clear``, raised by updates only). A sample of n
    draws one item in each of n equal slices of the mass ``priority^alpha`` (stratified,
    as DI-engine's sum tree: an item is drawn ``n priority^alpha / sum`` times on
    average), and returns copies with ``replay_unique_id``
    (``"<instance_name>_<n>"``, n counting every push from 0), ``replay_buffer_idx`` (``n
    mod replay_buffer_size``), ``priority``, ``use`` (the item's use count), ``staleness``
    (``cur_learner_iter - collect_iter``; -1 without ``collect_iter``) and ``IS``
    (``(N P(i))^-beta / max_j (N P(j))^-beta``). ``beta`` grows by ``(1 - beta) /
    anneal_step`` per sample of any process, up to 1. An item sampled ``max_use`` times
    is removed by that sample; before each sample, items whose staleness is at least
    ``max_staleness`` are removed. Within ``sample_range`` (positions of the insertion
    order) the draw is uniform.

    Args:
        cfg: as :class:`NaiveReplayBuffer`'s, with the advanced keys.
        tb_logger: as :class:`NaiveReplayBuffer`'s.
        exp_name: as :class:`NaiveReplayBuffer`'s.
        instance_name: as :class:`NaiveReplayBuffer`'s.
        url: as :class:`NaiveReplayBuffer`'s.
        name: as :class:`NaiveReplayBuffer`'s.
    """

    config: ClassVar[dict[str, Any]] = dict(
        type="advanced",
        replay_buffer_size=4096,
        max_use=float("inf"),
        max_staleness=float("inf"),
        alpha=0.6,
        beta=0.4,
        anneal_step=int(1e5),
        enable_track_used_data=False,
        deepcopy=False,
        thruput_controller=dict(
            push_sample_rate_limit=dict(max=float("inf"), min=0),
            window_seconds=30,
            sample_min_limit_ratio=1,
        ),
        monitor=dict(
            sampled_data_attr=dict(average_range=5, print_freq=200),
            periodic_thruput=dict(seconds=60),
        ),
    )

    def __init__(self, cfg: Mapping[str, Any] | None = None, tb_logger: Any = None,
                 exp_name: str | None = "default_experiment",
                 instance_name: str | None = "buffer", *, url: Any = None,
                 name: str | None = None) -> None:
        super().__init__(cfg, tb_logger, exp_name, instance_name, url=url, name=name)
        cfg = self._cfg
        self._eps = 1e-5
        self.check_list: list[Callable[[Any], bool]] = [lambda x: isinstance(x, dict)]
        self.alpha = float(cfg.alpha)
        assert 0 <= self.alpha <= 1, self.alpha
        beta = float(cfg.beta)
        assert 0 <= beta <= 1, beta
        self._anneal_step = cfg.anneal_step
        self._beta_anneal_step = (1 - beta) / self._anneal_step if self._anneal_step else 0.0
        max_use = use_limit(cfg.max_use)
        # DI-engine removes staleness >= max_staleness: redisbuf's max_staleness is the
        # largest staleness kept
        kept = number(cfg.max_staleness)
        if kept is None or math.isnan(kept) or kept <= 0:
            raise ValueError(
                f"max_staleness must be a number > 0 or inf, got {cfg.max_staleness!r}")
        max_staleness = None if kept == math.inf else math.ceil(kept) - 1
        self._max_use, self._max_staleness = max_use, max_staleness
        self.shared.configure(alpha=self.alpha, max_use=max_use, max_staleness=max_staleness)
        self.shared.client.hsetnx(self.shared.state_key, "adv_beta", repr(beta))
        thruput = cfg.thruput_controller
        limit = thruput.push_sample_rate_limit
        self._thruput = None
        if limit["max"] != float("inf") or limit["min"] != 0:
            self._thruput = ThruputRule(thruput)
        self._sample_min_limit_ratio = thruput.sample_min_limit_ratio
        assert self._sample_min_limit_ratio >= 1
        monitor = cfg.monitor
        self._monitor = BufferMonitor(str(instance_name), monitor.sampled_data_attr.average_range,
                                 monitor.sampled_data_attr.print_freq,
                                 monitor.periodic_thruput.seconds, tb_logger)

    # -- beta, on the server --------------------------------------------------------------

    @property
    def beta(self) -> float:
        """The IS exponent now (the buffer's: annealed by every process's samples)."""
        shared = self.shared
        beta, mark, samples = shared.client.hmget(shared.state_key, "adv_beta", "adv_mark",
                                                  "adv_samples")
        return self._beta_at(float(beta or self._cfg.beta), int(mark or 0), int(samples or 0))

    @beta.setter
    def beta(self, beta: float) -> None:
        shared = self.shared
        samples = shared.client.hget(shared.state_key, "adv_samples") or b"0"
        shared.client.hset(shared.state_key, mapping={"adv_beta": repr(float(beta)),
                                                       "adv_mark": samples})

    def _beta_at(self, beta: float, mark: int, samples: int) -> float:
        if not self._anneal_step:
            return beta
        return min(1.0, beta + self._beta_anneal_step * max(0, samples - mark))

    # -- writing ------------------------------------------------------------------------

    def push(self, data: Any, cur_collector_envstep: int = -1) -> None:
        """Push one dict, or each dict of a list (others are refused and logged), unless
        the throughput controller refuses the push (logged; nothing stored).

        Args:
            data: an item or a list of items.
            cur_collector_envstep: the collector's env step.
        """
        items = data if isinstance(data, list) else [data]
        if self._thruput is not None:
            can_push, why = self._thruput.can_push(len(items))
            if not can_push:
                logger.info("Refuse to push because %s", why)
                return
        valid: list[dict[str, Any]] = []
        for item in items:
            if all(check(item) for check in self.check_list):
                valid.append(item)
            else:
                logger.info("Illegal data type [%s], reject it...", type(item))
        priorities = [item.get("priority") for item in valid]
        ids = self._store(valid, priorities, [_collect_iter(item) for item in valid])
        for item, item_id in zip(valid, ids, strict=False):
            item["replay_unique_id"] = self._unique_id(item_id)
            item["replay_buffer_idx"] = (item_id - 1) % self._replay_buffer_size
        if self._thruput is not None:
            self._thruput.count(pushed=len(valid))

    def _default_priority(self) -> float:
        meta = self.shared.client.hmget(self.shared.keys.meta, "per_max", "per_initial")
        return max([float(v) for v in meta if v is not None], default=1.0)

    def _unique_id(self, item_id: int) -> str:
        return f"{self._instance_name}_{item_id - 1}"

    def _id_of(self, unique_id: Any) -> int | None:
        prefix = f"{self._instance_name}_"
        if not isinstance(unique_id, str) or not unique_id.startswith(prefix):
            return None
        number = unique_id[len(prefix):]
        return int(number) + 1 if number.isdigit() else None

    def update(self, info: dict[str, Any]) -> None:
        """Set the priorities of items (``priority + 1e-5``) named by ``replay_unique_id``
        and ``replay_buffer_idx``; items no longer stored (or whose idx does not match)
        are skipped.

        Args:
            info: lists ``replay_unique_id``, ``replay_buffer_idx``, ``priority``.
        """
        if "priority" not in info:
            return
        ids, priorities = [], []
        for unique_id, idx, priority in zip(info["replay_unique_id"], info["replay_buffer_idx"],
                                            info["priority"], strict=False):
            item_id = self._id_of(unique_id)
            if item_id is None or (item_id - 1) % self._replay_buffer_size != idx:
                logger.debug("[Skip Update]: buffer_idx: %s; id_in_update_info: %s", idx,
                             unique_id)
                continue
            assert priority >= 0, priority
            ids.append(item_id)
            priorities.append(float(priority) + self._eps)
        if ids:
            self.shared.per().update_priority(ids, priorities)

    # -- reading ------------------------------------------------------------------------

    def sample(self, size: int, cur_learner_iter: int,  # type: ignore[override]
               sample_range: slice | None = None) -> list[Any] | None:
        """Draw ``size`` items by priority (see the class); ``None`` when fewer than
        ``size * sample_min_limit_ratio`` are stored or the throughput controller refuses.

        Args:
            size: how many items.
            cur_learner_iter: the learner's iteration (staleness).
            sample_range: positions of the insertion order to draw among, uniformly.

        Returns:
            The items, or ``None``.
        """
        if size == 0:
            return []
        shared = self.shared
        if self._max_staleness is not None:
            shared.engine.update_model_version(SESSION, int(cur_learner_iter))
        count = self.count()
        if count / size < self._sample_min_limit_ratio:
            logger.info("Refuse to sample: not enough for sampling. valid(%d) / sample(%d) < "
                        "sample_min_limit_ratio(%s)", count, size, self._sample_min_limit_ratio)
            return None
        if self._thruput is not None:
            can_sample, why = self._thruput.can_sample(size)
            if not can_sample:
                logger.info("Refuse to sample due to thruput: %s", why)
                return None
        try:
            if sample_range is None:
                info = shared.per().sample_with_info(size)
                ratios = info.weights
            else:
                info = shared.engine.sample_with_info(size, replacement=True,
                                                      sample_range=sample_range)
                ratios = None
        except EmptyBufferError:
            return None
        ids = info.ids.tolist()
        members = [format_id(i) for i in ids]
        pipe = shared.client.pipeline(transaction=False)
        pipe.hmget(shared.keys.uses, members)
        pipe.hincrby(shared.state_key, "adv_samples", 1)
        pipe.hmget(shared.state_key, "adv_beta", "adv_mark")
        uses, samples, (beta_text, mark) = pipe.execute()
        # the priorities at the draw (an item used up by it is no longer stored: 0)
        if info.priorities is not None:
            priorities = info.priorities.tolist()
        else:
            priorities = np.nan_to_num(shared.engine.priorities(ids), nan=0.0).tolist()
        beta = self._beta_at(float(beta_text or self._cfg.beta), int(mark or 0), int(samples) - 1)
        if ratios is None:  # uniform within sample_range: IS from the priorities drawn
            masses = np.array(priorities, dtype=np.float64) ** self.alpha
            ratios = np.divide(masses.min(initial=np.inf), masses, out=np.ones_like(masses),
                               where=masses > 0)
        out = []
        for position, (item_id, data) in enumerate(zip(ids, info.batch, strict=True)):
            data["replay_unique_id"] = self._unique_id(item_id)
            data["replay_buffer_idx"] = (item_id - 1) % self._replay_buffer_size
            data["priority"] = float(priorities[position])
            used = uses[position]
            data["use"] = int(used) if used is not None else (self._max_use or 0)
            collect = _collect_iter(data)
            data["staleness"] = cur_learner_iter - (cur_learner_iter + 1 if collect is None
                                                    else collect)
            data["IS"] = float(ratios[position]) ** beta
            out.append(data)
        if self._thruput is not None:
            self._thruput.count(sampled=size)
        if self._enable_track_used_data and self._max_use is not None:
            for data, used in zip(out, uses, strict=True):
                if used is None and "data_id" in data:
                    self._used_data_remover.add_used_data(data)
        self._monitor.sampled(_attributes(out, beta), cur_learner_iter)
        return out

    def state_dict(self) -> dict[str, Any]:
        """``data`` (every item with its ``priority``, oldest first), ``use_count``
        (per item), ``max_priority``, ``beta``, ``anneal_step``, ``valid_count``,
        ``push_count``.

        Returns:
            The state.
        """
        shared = self.shared
        members = shared.client.zrange(shared.keys.order, 0, -1)
        blobs = shared.engine.records([int(m) for m in members])
        read: list[float] = (shared.engine.priorities([int(m) for m in members]).tolist()
                             if members else [])
        priorities = [None if p != p else float(p) for p in read]  # NaN: not stored
        uses = shared.client.hmget(shared.keys.uses, members) if members else []
        data = []
        for blob, priority in zip(blobs, priorities, strict=True):
            if blob is not None:
                item = nest.decode_nest(blob)
                item["priority"] = float(priority) if priority is not None else None
                data.append(item)
        return {
            "data": data, "use_count": [int(u or 0) for u in uses],
            "max_priority": self._default_priority(), "beta": self.beta,
            "anneal_step": self._anneal_step, "valid_count": self.count(),
            "push_count": self.push_count,
        }

    def load_state_dict(self, _state_dict: dict[str, Any], deepcopy: bool = False) -> None:
        """Push the items of a state's ``data`` with their priorities (after clearing the
        buffer and setting ``beta`` when the state is a whole one from
        :meth:`state_dict`).

        Args:
            _state_dict: the state.
            deepcopy: unused: items are always copied.
        """
        assert "data" in _state_dict
        if set(_state_dict) != {"data"}:
            self.shared.engine.clear()
            if "beta" in _state_dict:
                self.beta = _state_dict["beta"]
        self.push([dict(item) for item in _state_dict["data"]], 0)


def _attributes(items: list[dict[str, Any]], beta: float) -> dict[str, float]:
    uses = [d["use"] for d in items]
    priorities = [d["priority"] for d in items]
    staleness = [d["staleness"] for d in items]
    return {
        "count": len(items), "use_avg": float(np.mean(uses)), "use_max": float(max(uses)),
        "priority_avg": float(np.mean(priorities)), "priority_max": float(max(priorities)),
        "priority_min": float(min(priorities)), "staleness_avg": float(np.mean(staleness)),
        "staleness_max": float(max(staleness)), "beta": beta,
    }


_REGISTRY: dict[str, type[NaiveReplayBuffer]] = {
    "naive": NaiveReplayBuffer,
    "advanced": AdvancedReplayBuffer,
    "episode": EpisodeReplayBuffer,
}


def get_buffer_cls(cfg: Mapping[str, Any]) -> type[NaiveReplayBuffer]:
    """The buffer class of ``cfg["type"]`` (``naive``, ``advanced``, ``episode``).

    Args:
        cfg: a config with ``type``.

    Returns:
        The class.
    """
    try:
        return _REGISTRY[cfg["type"]]
    except KeyError:
        raise KeyError(f"unknown buffer type {cfg.get('type')!r}; known: "
                       f"{sorted(_REGISTRY)}") from None


def create_buffer(cfg: Mapping[str, Any], *args: Any, **kwargs: Any) -> IBuffer:
    """A buffer of ``cfg["type"]`` made from ``cfg`` and the other arguments (a naive
    buffer drops ``tb_logger``, as DI-engine's ``create_buffer``).

    Args:
        cfg: the config.
        *args: the buffer's other arguments.
        **kwargs: the buffer's other keyword arguments (``url``, ``name`` included).

    Returns:
        The buffer.
    """
    if cfg["type"] == "naive":
        kwargs.pop("tb_logger", None)
    return get_buffer_cls(cfg)(cfg, *args, **kwargs)
