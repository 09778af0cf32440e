"""Data lifetime: how many times an item may be sampled, model versions and sessions.

The rules live in Redis and are applied by the scripts themselves, so they hold for
every process sharing a buffer:

- ``max_use`` (DI-engine ``max_use``, MineStudio ``max_reuse``, Reverb
  ``max_times_sampled``): ``record_draws`` in ``lua/_items.lua``, run by the same script
  that draws, counts one use per draw and removes an item on its ``max_use``-th use.
- ``max_staleness`` and sessions (MineStudio): ``admit_batch`` refuses adds whose model
  version is more than ``max_staleness`` behind the current one or whose session is not
  the current one; ``update_model_version`` removes items that stop fitting.

Both settings are fixed when a buffer is created, like its capacity.
"""

from __future__ import annotations

import numbers
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigMismatchError, SamplingError

if TYPE_CHECKING:
    from .base import BufferView


def check_setting(name: str, value: int | None, minimum: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum} or None, got {value!r}")
    return int(value)


def check_version(model_version: Any) -> int:
    if isinstance(model_version, bool) or not isinstance(model_version, numbers.Integral):
        raise ValueError(f"model_version must be an integer, got {model_version!r}")
    if abs(int(model_version)) >= 2**53:
        raise ValueError(f"model_version {model_version} is out of range (|v| < 2**53)")
    return int(model_version)


def check_session(session_id: Any) -> str:
    if not isinstance(session_id, str) or not session_id:
        raise ValueError(f"session_id must be a non-empty string, got {session_id!r}")
    return session_id


def configure(
    buffer: BufferView, max_use: int | None, max_staleness: int | None
) -> tuple[int | None, int | None]:
    """Store the settings on a new buffer, or check them against an existing one's
    (None adopts what is stored). Returns the stored ``(max_use, max_staleness)``."""
    max_use = check_setting("max_use", max_use, 1)
    max_staleness = check_setting("max_staleness", max_staleness, 0)
    reply = buffer.run(
        "lifetime_config",
        [buffer.keys.meta],
        ["" if max_use is None else max_use, "" if max_staleness is None else max_staleness],
        read=max_use is None and max_staleness is None,  # then it stores nothing
    )
    stored = tuple(int(v) if v not in (b"", "") else None for v in reply)
    asked_for = (max_use, max_staleness)
    for name, asked, have in zip(("max_use", "max_staleness"), asked_for, stored, strict=True):
        if asked is not None and asked != have:
            raise ConfigMismatchError(
                f"buffer {buffer.name!r} exists with {name}={have}, not {asked} ({name} "
                "is fixed when the buffer is created)"
            )
    return stored[0], stored[1]


def add_options(model_version: Any, session_id: Any) -> dict[str, Any]:
    """The add script's per-batch options for a version and session (either may be None)."""
    options: dict[str, Any] = {}
    if model_version is not None:
        options["model_version"] = check_version(model_version)
    if session_id is not None:
        options["session_id"] = check_session(session_id)
    return options


def update_model_version(buffer: BufferView, session_id: str, model_version: int) -> int:
    """See :meth:`ReplayBuffer.update_model_version`."""
    session_id = check_session(session_id)
    model_version = check_version(model_version)
    keys = buffer.keys.all_keys()
    removed, left = buffer.run("update_model_version", keys, [session_id, model_version, ""])
    removed = int(removed)
    # stale items go in commands of at most bounds.MAX_ADD_ITEMS; a later call goes by the
    # version current then (another process may have made a newer one current meanwhile)
    while int(left):
        more, left = buffer.run("update_model_version", keys, ["", 0, "more"])
        removed += int(more)
    return removed


def _ratio(numerator: str | None, denominator: str | None) -> float | None:
    count = float(denominator or 0)
    return float(numerator or 0) / count if count > 0 else None


class RateMeter:
    """Insert and sample rates (items per second) between two ``stats()`` calls of one
    process, from the buffer's global counters (DI-engine's throughput monitor)."""

    def __init__(self) -> None:
        self._last: tuple[float, int, int] | None = None

    def rates(self, meta: dict[str, str]) -> dict[str, float | None]:
        now = time.time()
        inserted, sampled = int(meta.get("inserted", 0)), int(meta.get("sampled", 0))
        if self._last is None:
            since = float(meta.get("created_at", now))
            last_inserted = last_sampled = 0
        else:
            since, last_inserted, last_sampled = self._last
        self._last = (now, inserted, sampled)
        elapsed = now - since
        if elapsed <= 0 or inserted < last_inserted or sampled < last_sampled:
            return {"insert_rate": None, "sample_rate": None}  # no time passed, or cleared
        return {
            "insert_rate": (inserted - last_inserted) / elapsed,
            "sample_rate": (sampled - last_sampled) / elapsed,
        }


def lifetime_stats(meta: dict[str, str], length: int) -> dict[str, Any]:
    """The data-lifetime part of ``stats()``, from the meta hash (no scan)."""
    version = meta.get("cur_version")
    return {
        "max_use": int(meta["max_use"]) if "max_use" in meta else None,
        "max_staleness": int(meta["max_staleness"]) if "max_staleness" in meta else None,
        "model_version": int(version) if version is not None else None,
        "session_id": meta.get("cur_session"),
        "mean_use_present": _ratio(meta.get("present_uses"), str(length)),
        "mean_use_removed": _ratio(meta.get("removed_uses"), meta.get("removed_items")),
        "removed_items": int(meta.get("removed_items", 0)),
        "used_up": int(meta.get("retired", 0)),
        "stale_removed": int(meta.get("stale_removed", 0)),
        "rejected_stale": int(meta.get("rejected_stale", 0)),
        "rejected_session": int(meta.get("rejected_session", 0)),
        "mean_staleness_sampled": _ratio(meta.get("staleness_sum"), meta.get("staleness_count")),
    }


def priority_stats(buffer: BufferView, meta: dict[str, str]) -> dict[str, Any]:
    """Priority min / mean / max: of PER priorities when the buffer keeps them (from this
    process's replica of them, caught up now: the server keeps them only as the mass log
    and its snapshot), else min / max of the log-rewards (no mean: it would need a scan)."""
    keys = buffer.keys
    if meta.get("mass") == "per" and meta.get("masslog") == "1":
        from .replica import readable_replica

        try:  # a user who may not sample reads with the read-only scripts
            replica = readable_replica(buffer, "per")
            with replica.lock:
                replica.sync(buffer)
                scores = replica.scores[: replica.count].copy()
        except SamplingError:  # (read-only) the log moved past every read: nothing to show
            return {"priority_min": None, "priority_mean": None, "priority_max": None}
        scores = scores[~np.isnan(scores)]
        if len(scores):
            return {
                "priority_min": float(scores.min()),
                "priority_mean": float(scores.mean()),
                "priority_max": float(scores.max()),
            }
    if meta.get("rewards") == "0":  # no log-rewards stored: every item's is 0
        present = buffer.client.zcard(keys.order) > 0
        return {"priority_min": 0.0 if present else None, "priority_mean": None,
                "priority_max": 0.0 if present else None}
    pipe = buffer.client.pipeline(transaction=False)
    pipe.zrange(keys.prio, 0, 0, withscores=True)
    pipe.zrange(keys.prio, -1, -1, withscores=True)
    low, high = pipe.execute()
    return {
        "priority_min": float(low[0][1]) if low else None,
        "priority_mean": None,
        "priority_max": float(high[0][1]) if high else None,
    }


__all__ = [
    "RateMeter", "add_options", "configure", "lifetime_stats", "priority_stats",
    "update_model_version",
]
