"""Data lifetime (redisbuf/sampling/lifetime.py, record_draws / admit_batch in lua/_items.lua):
max_use, model versions and sessions, per-item use counts / times / versions, stats.

The deterministic rules are checked by hypothesis against a small in-memory model that
is told which ids redisbuf drew and predicts everything else; the global max_use rule is
also checked with several OS processes on a real server."""

from __future__ import annotations

import time
import traceback
import uuid
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from key_contents import key_contents
from process_helpers import fresh_context

from redisbuf import ReplayBuffer
from redisbuf.control.ipc import MessageQueue
from redisbuf.errors import ConfigMismatchError, EmptyBufferError


def _batch(n: int, start: int = 0) -> dict[str, np.ndarray]:
    return {
        "x": np.arange(start, start + n, dtype=np.int64)[:, None],
        "log_rewards": np.zeros(n),
    }


def _snapshot(client, buf) -> dict[bytes, bytes | None]:
    return key_contents(client, buf.keys.all_keys())


@dataclass
class Model:
    """What the buffer should hold: id -> [uses, version or None], oldest first."""

    capacity: int
    max_use: int | None
    max_staleness: int | None
    items: dict[int, list] = field(default_factory=dict)
    next_id: int = 1
    session: str | None = None
    version: int | None = None
    used_up: int = 0
    stale_removed: int = 0
    rejected_stale: int = 0
    rejected_session: int = 0
    removed_uses: int = 0
    removed_items: int = 0
    staleness: list[int] = field(default_factory=list)

    def _remove(self, ids) -> None:
        for i in ids:
            self.removed_uses += self.items.pop(i)[0]
            self.removed_items += 1

    def add(self, n: int, version: int | None, session: str | None) -> str | None:
        if session is not None and self.session is not None and session != self.session:
            self.rejected_session += n
            return "session"
        if (version is not None and self.version is not None and self.max_staleness is not None
                and self.version - version > self.max_staleness):
            self.rejected_stale += n
            return "stale"
        if session is not None and self.session is None:
            self.session = session
        for _ in range(n):
            self.items[self.next_id] = [0, version]
            self.next_id += 1
        excess = len(self.items) - self.capacity
        if excess > 0:
            self._remove(list(self.items)[:excess])
        return None

    def drawn(self, ids: list[int]) -> None:
        assert all(i in self.items for i in ids), f"drew absent ids {ids} of {list(self.items)}"
        for i in ids:
            if self.version is not None and self.items[i][1] is not None:
                self.staleness.append(self.version - self.items[i][1])
        for i, k in Counter(ids).items():
            self.items[i][0] += k
        if self.max_use is not None:
            done = [i for i in dict.fromkeys(ids) if self.items[i][0] >= self.max_use]
            self.used_up += len(done)
            self._remove(done)

    def update(self, session: str, version: int) -> int:
        before = len(self.items)
        if self.session is not None and session != self.session:
            self._remove(list(self.items))
        self.session, self.version = session, version
        if self.max_staleness is not None:
            self._remove([i for i, (_, v) in self.items.items()
                          if v is not None and v < version - self.max_staleness])
        removed = before - len(self.items)
        self.stale_removed += removed
        return removed


def _check(client, buf: ReplayBuffer, model: Model) -> None:
    keys = buf.keys
    ids = [int(m) for m in client.zrange(keys.order, 0, -1)]
    assert ids == list(model.items)
    uses = {int(k): int(v) for k, v in client.hgetall(keys.uses).items()}
    assert uses == {i: u for i, (u, _) in model.items.items() if u > 0}
    versions = {int(m): int(s) for m, s in client.zrange(keys.versions, 0, -1, withscores=True)}
    assert versions == {i: v for i, (_, v) in model.items.items() if v is not None}
    # one entry per add, scored by its first id: each item is covered by one, and the
    # oldest entry covers the oldest item (older ones are trimmed)
    firsts = [int(s) for _, s in client.zrange(keys.times, 0, -1, withscores=True)]
    if model.items:
        assert firsts and firsts[0] <= min(model.items)
        assert len(firsts) == 1 or firsts[1] > min(model.items)
    else:
        assert firsts == []
    stats = buf.stats()
    assert stats["used_up"] == model.used_up
    assert stats["stale_removed"] == model.stale_removed
    assert stats["rejected_stale"] == model.rejected_stale
    assert stats["rejected_session"] == model.rejected_session
    assert stats["removed_items"] == model.removed_items
    present = sum(u for u, _ in model.items.values())
    if model.items:
        assert stats["mean_use_present"] == pytest.approx(present / len(model.items))
    if model.removed_items:
        assert stats["mean_use_removed"] == pytest.approx(model.removed_uses / model.removed_items)
    if model.staleness:
        assert stats["mean_staleness_sampled"] == pytest.approx(np.mean(model.staleness))
    else:
        assert stats["mean_staleness_sampled"] is None


operation = st.one_of(
    st.tuples(st.just("add"), st.integers(1, 6), st.one_of(st.none(), st.integers(0, 8)),
              st.sampled_from([None, "a", "b"])),
    st.tuples(st.just("sample"), st.integers(1, 8), st.booleans()),
    st.tuples(st.just("update"), st.sampled_from(["a", "b"]), st.integers(0, 8)),
)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    capacity=st.integers(3, 12),
    max_use=st.one_of(st.none(), st.integers(1, 3)),
    max_staleness=st.one_of(st.none(), st.integers(0, 3)),
    ops=st.lists(operation, max_size=25),
    seed=st.integers(0, 2**16),
)
def test_lifetime_rules_match_a_reference_model(
    client, capacity, max_use, max_staleness, ops, seed
) -> None:
    name = f"life-{uuid.uuid4().hex[:8]}"
    buf = ReplayBuffer(client, name, capacity=capacity, max_use=max_use,
                       max_staleness=max_staleness, seed=seed)
    model = Model(capacity, max_use, max_staleness)
    for op in ops:
        if op[0] == "add":
            _, n, version, session = op
            result = buf.add(_batch(n), model_version=version, session_id=session)
            assert result.rejected == model.add(n, version, session)
        elif op[0] == "sample":
            _, n, replacement = op
            if not model.items:
                with pytest.raises(EmptyBufferError):
                    buf.sample_with_info(n, replacement=replacement)
                continue
            info = buf.sample_with_info(n, replacement=replacement)
            assert info.batch["x"].shape == (n, 1)
            model.drawn(info.ids.tolist())
        else:
            _, session, version = op
            assert buf.update_model_version(session, version) == model.update(session, version)
        _check(client, buf, model)
    buf.drop()


def test_max_use_removes_an_item_on_its_last_use(client, buffer_name) -> None:
    buf = ReplayBuffer(client, buffer_name, capacity=10, max_use=2, seed=0)
    buf.add(_batch(3))
    first = buf.sample_with_info(3)
    assert sorted(first.ids.tolist()) == [1, 2, 3] and len(buf) == 3
    second = buf.sample_with_info(3)  # the second use of each: returned, then removed
    assert sorted(second.batch["x"][:, 0].tolist()) == [0, 1, 2]
    assert len(buf) == 0
    stats = buf.stats()
    assert stats["used_up"] == 3 and stats["mean_use_removed"] == 2.0


def test_max_use_with_prioritized_sampling(client, buffer_name) -> None:
    buf = ReplayBuffer(client, buffer_name, capacity=10, prioritized_sampling=True,
                       max_use=1, seed=1)
    buf.add(_batch(4))
    drawn = Counter()
    while len(buf):
        drawn.update(buf.sample_with_info(1).ids.tolist())
    assert drawn == Counter({1: 1, 2: 1, 3: 1, 4: 1})
    with pytest.raises(EmptyBufferError):
        buf.sample(1)


def test_settings_are_fixed_at_creation(client, buffer_name) -> None:
    ReplayBuffer(client, buffer_name, capacity=10, max_use=3, max_staleness=2)
    assert ReplayBuffer(client, buffer_name, capacity=10).max_use == 3  # None adopts
    with pytest.raises(ConfigMismatchError, match="max_use=3, not 4"):
        ReplayBuffer(client, buffer_name, capacity=10, max_use=4)
    with pytest.raises(ConfigMismatchError, match="max_staleness=2, not 1"):
        ReplayBuffer(client, buffer_name, capacity=10, max_staleness=1)
    other = f"{buffer_name}-b"
    ReplayBuffer(client, other, capacity=10).add(_batch(1))
    with pytest.raises(ConfigMismatchError, match="fixed when the buffer is created"):
        ReplayBuffer(client, other, capacity=10, max_use=2)


@pytest.mark.parametrize(
    "kwargs, match",
    [({"max_use": 0}, "max_use"), ({"max_use": 1.5}, "max_use"), ({"max_use": True}, "max_use"),
     ({"max_staleness": -1}, "max_staleness")],
)
def test_bad_settings_are_refused(client, buffer_name, kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        ReplayBuffer(client, buffer_name, capacity=10, **kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [({"model_version": "3"}, "model_version"), ({"model_version": 2.5}, "model_version"),
     ({"model_version": 2**60}, "out of range"), ({"session_id": ""}, "session_id"),
     ({"session_id": 7}, "session_id")],
)
def test_bad_versions_and_sessions_change_nothing(client, buffer_name, kwargs, match) -> None:
    buf = ReplayBuffer(client, buffer_name, capacity=10, max_staleness=1)
    buf.add(_batch(2), model_version=1, session_id="s")
    before = _snapshot(client, buf)
    with pytest.raises(ValueError, match=match):
        buf.add(_batch(2), **kwargs)
    with pytest.raises(ValueError, match=match.split()[0] if "range" not in match else match):
        buf.update_model_version(kwargs.get("session_id", "s"), kwargs.get("model_version", 1))
    assert _snapshot(client, buf) == before


def test_a_refused_batch_is_counted_and_not_stored(client, buffer_name) -> None:
    buf = ReplayBuffer(client, buffer_name, capacity=10, max_staleness=1)
    buf.update_model_version("s", 5)
    # the batch-id memory keeps each refusal, so a retried add gets the same answer; no
    # other key changes
    remembered = {buf.keys.batches, buf.keys.batches_old}
    item_keys = [k for k in buf.keys.data_keys() if k not in remembered]
    keys_before = key_contents(client, item_keys)
    result = buf.add(_batch(3), model_version=3, session_id="s")
    assert result.rejected == "stale" and len(result.ids) == 0
    assert buf.add(_batch(2), model_version=5, session_id="t").rejected == "session"
    assert key_contents(client, item_keys) == keys_before
    assert client.hlen(buf.keys.batches) == 3  # the two refusals and "~since"
    stats = buf.stats()
    assert (stats["rejected_stale"], stats["rejected_session"], stats["inserted"]) == (3, 2, 0)


def _insertion_time(client, keys, item_id: int) -> float:
    """The documented lookup: the entry with the greatest first id <= the item's id."""
    (entry,) = client.zrevrangebyscore(keys.times, item_id, "-inf", start=0, num=1)
    first, stamp = entry.decode().split("|")
    assert int(first) <= item_id
    return float(stamp)


def test_insertion_time_is_recorded_once_per_add(client, buffer_name) -> None:
    buf = ReplayBuffer(client, buffer_name, capacity=5)
    before = time.time()
    first = buf.add(_batch(3)).ids.tolist()
    time.sleep(0.01)
    second = buf.add(_batch(2)).ids.tolist()
    assert client.zcard(buf.keys.times) == 2
    t1 = {_insertion_time(client, buf.keys, i) for i in first}
    t2 = {_insertion_time(client, buf.keys, i) for i in second}
    assert len(t1) == len(t2) == 1 and before - 5 <= t1.pop() < t2.pop() <= time.time() + 5
    buf.add(_batch(3))  # evicts the first add whole: its entry goes
    assert client.zcard(buf.keys.times) == 2
    assert client.zscore(buf.keys.times, client.zrange(buf.keys.times, 0, 0)[0]) == second[0]
    buf.add(_batch(1))  # evicts one item of the second add: its entry stays
    assert client.zcard(buf.keys.times) == 3
    _insertion_time(client, buf.keys, second[1])


def test_clear_resets_the_lifetime_counters(client, buffer_name) -> None:
    buf = ReplayBuffer(client, buffer_name, capacity=10, max_use=1, seed=0)
    buf.add(_batch(3))
    buf.sample(2)
    buf.clear()
    stats = buf.stats()
    assert (stats["used_up"], stats["removed_items"], stats["mean_use_present"]) == (0, 0, None)
    assert client.hlen(buf.keys.uses) == 0 and client.zcard(buf.keys.times) == 0


def test_rates_come_from_the_global_counters(client, buffer_name) -> None:
    buf = ReplayBuffer(client, buffer_name, capacity=100)
    buf.stats()
    ReplayBuffer(client, buffer_name, capacity=100).add(_batch(10))  # another "process"
    time.sleep(0.05)
    rates = buf.stats()
    assert rates["insert_rate"] > 0 and rates["sample_rate"] == 0


# -- several OS processes on a real server -------------------------------------------------

MAX_USE = 3
ITEMS = 60


def _drainer(url: str, name: str, index: int, start, results) -> None:
    try:
        buf = ReplayBuffer(url, name, capacity=ITEMS, seed=index)
        start.wait(timeout=60)
        drawn: list[int] = []
        while True:
            try:
                # one item per draw: a batch larger than what is left would be drawn with
                # replacement, and an item drawn twice in it counts (and returns) twice
                drawn.extend(buf.sample_with_info(1).ids.tolist())
            except EmptyBufferError:
                break
        results.put({"worker": index, "drawn": drawn})
    except BaseException:  # noqa: BLE001 - reported to the parent as text
        results.put({"worker": index, "error": traceback.format_exc()})


@pytest.mark.redis_server
@pytest.mark.multiprocess
def test_max_use_holds_across_processes(redis_server, real_client, buffer_name) -> None:
    buf = ReplayBuffer(real_client, buffer_name, capacity=ITEMS, max_use=MAX_USE)
    buf.add(_batch(ITEMS))
    ctx = fresh_context()
    start, results = ctx.Barrier(4), MessageQueue(ctx)
    procs = [ctx.Process(target=_drainer, args=(redis_server.url, buffer_name, i, start, results))
             for i in range(4)]
    for proc in procs:
        proc.start()
    reports = [results.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    errors = [r["error"] for r in reports if "error" in r]
    assert not errors, errors[0]
    total = Counter(i for r in reports for i in r["drawn"])
    # every item was returned exactly max_use times in all, whichever process drew it
    assert total == Counter({i: MAX_USE for i in range(1, ITEMS + 1)})
    assert len(buf) == 0 and buf.stats()["used_up"] == ITEMS
    assert buf.stats()["mean_use_removed"] == MAX_USE


@pytest.mark.parametrize("mode", ["per", "fifo", "lifo", "window", "recent"])
def test_max_use_holds_for_every_sampling_mode(client, buffer_name, mode) -> None:
    from redisbuf import FifoSampler, LifoSampler, PERSampler

    kwargs: dict = {"per": {"sampler": PERSampler()}, "fifo": {"sampler": FifoSampler()},
                    "lifo": {"sampler": LifoSampler()},
                    "recent": {"recent_data_ratio": 0.5, "recent_data_steps": 3}}.get(mode, {})
    buf = ReplayBuffer(client, buffer_name, capacity=20, max_use=2, seed=3, **kwargs)
    buf.add(_batch(6))
    returned = Counter()
    while len(buf):
        if mode == "window":
            info = buf.sample_with_info(1, sample_range=slice(-4, None))
        else:
            info = buf.sample_with_info(1)
        returned.update(info.ids.tolist())
        # every draw returns its item's blob, even the one that used it up
        assert info.batch["x"][0, 0] == info.ids[0] - 1
    assert returned == Counter({i: 2 for i in range(1, 7)})
    assert buf.stats()["used_up"] == 6


def test_priority_stats(client, buffer_name) -> None:
    from redisbuf import PERSampler

    per = ReplayBuffer(client, buffer_name, capacity=20, sampler=PERSampler())
    per.add(_batch(3), priorities=[1.0, 2.0, 6.0])
    stats = per.stats()
    assert (stats["priority_min"], stats["priority_mean"], stats["priority_max"]) == (1, 3, 6)
    plain = ReplayBuffer(client, f"{buffer_name}-plain", capacity=20)
    plain.add({"x": np.zeros((3, 1)), "log_rewards": np.array([-1.0, 0.5, 2.0])})
    stats = plain.stats()
    assert (stats["priority_min"], stats["priority_mean"], stats["priority_max"]) == (-1, None, 2)


def test_undone_draws_give_their_uses_back(client, buffer_name) -> None:
    """A draw the sampler discards (an item vanished before its blob was read) is taken
    back by undo_draws: its use no longer counts for the items still present."""
    buf = ReplayBuffer(client, buffer_name, capacity=10, seed=0)
    buf.add(_batch(3))
    buf.sample_with_info(3)
    buf.sample_with_info(3)
    members = [b"000000000001", b"000000000002", b"000000000002"]
    buf._run("undo_draws", buf.keys.all_keys(), members)
    uses = {int(k): int(v) for k, v in client.hgetall(buf.keys.uses).items()}
    assert uses == {1: 1, 3: 2}  # id 2 went from 2 uses to none
    stats = buf.stats()
    assert stats["sampled"] == 3 and stats["mean_use_present"] == pytest.approx(1.0)
