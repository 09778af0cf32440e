"""The in-process parts of DI-engine's replay buffers: the used-data file remover, the
push / sample throughput rule and the monitors. Each process keeps its own."""

from __future__ import annotations

import logging
import math
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

logger = logging.getLogger("redisbuf.ding")

__all__ = ["BufferMonitor", "ThruputRule", "UsedDataRemover"]


class UsedDataRemover:
    """Deletes the files of data that left the buffer (DI-engine's ``UsedDataRemover``):
    a data dict's ``data_id`` names the file, removed by a background thread."""

    def __init__(self) -> None:
        self._used_data: queue.Queue[str] = queue.Queue()
        self._end_flag = True
        self._thread = threading.Thread(target=self._delete_used_data, name="delete_used_data",
                                        daemon=True)

    def start(self) -> None:
        """Start the thread."""
        self._end_flag = False
        self._thread.start()

    def close(self) -> None:
        """Stop the thread (once it has deleted the file it took, if any), then delete
        every file still queued."""
        self._end_flag = True
        if self._thread.is_alive():
            self._thread.join()
        while not self._used_data.empty():
            _remove_file(self._used_data.get())

    def add_used_data(self, data: Any) -> None:
        """Queue the file of ``data`` (a dict with ``data_id``) for deletion.

        Args:
            data: the data that left the buffer.
        """
        assert data is not None and isinstance(data, dict) and "data_id" in data
        self._used_data.put(data["data_id"])

    def _delete_used_data(self) -> None:
        while not self._end_flag:
            try:
                _remove_file(self._used_data.get(timeout=0.01))
            except queue.Empty:
                pass


def _remove_file(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


class ThruputRule:
    """Push and sample counts of the last ``window_seconds`` seconds, decayed as
    DI-engine's ``ThruputController`` decays them (by 0.01 over the window), and its
    two rules: a push is refused when push / sample would exceed ``max``, a sample when
    push / sample would fall below ``min``. This process's counts."""

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        limit = cfg["push_sample_rate_limit"]
        assert "min" in limit and limit["min"] >= 0
        assert "max" in limit and limit["max"] <= float("inf")
        self.max, self.min = float(limit["max"]), float(limit["min"])
        self.factor = 0.01 ** (1 / cfg["window_seconds"])
        self.pushed = self.sampled = 0.0
        self.stamp = time.monotonic()
        self.lock = threading.Lock()

    def _decay(self) -> None:
        now = time.monotonic()
        seconds = math.floor(now - self.stamp)
        if seconds > 0:
            self.pushed *= self.factor ** seconds
            self.sampled *= self.factor ** seconds
            self.stamp += seconds

    def can_push(self, size: int) -> tuple[bool, str]:
        with self.lock:
            self._decay()
            if abs(self.sampled) < 1e-5:
                return True, "Can push because `self._history_sample_count` < 1e-5"
            if (self.pushed + size) / self.sampled > self.max:
                return False, (f"push({self.pushed}+{size}) / sample({self.sampled}) > "
                               f"limit_max({self.max})")
            return True, "Can push."

    def can_sample(self, size: int) -> tuple[bool, str]:
        with self.lock:
            self._decay()
            if self.pushed / (self.sampled + size) < self.min:
                return False, (f"push({self.pushed}) / sample({self.sampled}+{size}) < "
                               f"limit_min({self.min})")
            return True, "Can sample."

    def count(self, pushed: int = 0, sampled: int = 0) -> None:
        with self.lock:
            self._decay()
            self.pushed += pushed
            self.sampled += sampled


class BufferMonitor:
    """DI-engine's monitors without their threads: the sampled items' use, priority and
    staleness averaged over the last ``average_range`` samples, logged every
    ``print_freq`` samples, and push / sample / remove counts logged every ``seconds``
    seconds (to ``tb_logger.add_scalar`` too, when one is given)."""

    def __init__(self, name: str, average_range: int, print_freq: int, seconds: float,
                 tb_logger: Any) -> None:
        self.name, self.print_freq, self.seconds = name, print_freq, seconds
        self.tb_logger = tb_logger
        self.recent: deque[dict[str, float]] = deque(maxlen=max(1, average_range))
        self.samples = 0
        self.period_start = time.monotonic()
        self.periods = 0
        self.counts = {"pushed_in": 0, "sampled_out": 0, "removed": 0}

    def sampled(self, values: dict[str, float], learner_iter: int) -> None:
        self.counts["sampled_out"] += int(values.pop("count"))
        self.recent.append(values)
        if self.samples % self.print_freq == 0:
            report = {}
            for key in ("use", "priority", "staleness"):
                for kind, reduce in (("avg", np.mean), ("max", np.max), ("min", np.min)):
                    if kind == "min" and key != "priority":
                        continue
                    report[f"{key}_{kind}"] = float(reduce([v[f"{key}_{kind}"]
                                                            for v in self.recent]))
            report["beta"] = values.get("beta", 0.0)
            logger.info("=== Sample data %d Times === %s", self.samples, report)
            if self.tb_logger is not None and learner_iter != -1:
                for key, value in report.items():
                    self.tb_logger.add_scalar(f"{self.name}_iter/{key}", value, learner_iter)
        self.samples += 1
        self.tick(0)

    def tick(self, valid: int) -> None:
        if time.monotonic() - self.period_start < self.seconds:
            return
        report = dict(self.counts, current_have=valid)
        logger.info("In the past %.1f seconds, buffer statistics is as follows: %s",
                    time.monotonic() - self.period_start, report)
        if self.tb_logger is not None:
            for key, value in report.items():
                self.tb_logger.add_scalar(f"{self.name}_sec/{key}", value, self.periods)
        self.counts = dict.fromkeys(self.counts, 0)
        self.period_start = time.monotonic()
        self.periods += 1
