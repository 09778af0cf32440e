"""SequenceBuffer (ALF's per-environment ReplayBuffer) against an in-memory model.

Every step carries its env id and position, so each sampled window is checked to be made
of present, consecutive steps of one environment, and to lie inside one episode.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redisbuf.buffers.sequence import FIRST, LAST, MID, SequenceBuffer, SequenceKeys
from redisbuf.errors import ConfigMismatchError, EmptyBufferError, InvalidBatchError, SchemaError


@dataclass
class EnvModel:
    """One environment's stream: every step ever added, and which are stored."""

    begins: list[bool] = field(default_factory=list)  # per position: began an episode
    ends: list[bool] = field(default_factory=list)  # per position: ended an episode
    rewards: list[float] = field(default_factory=list)
    start: int = 0

    @property
    def next(self) -> int:
        return len(self.begins)

    def add(self, first: bool, last: bool, reward: float, max_length: int) -> int:
        p = self.next
        empty = self.start == p
        self.begins.append(empty or (p > 0 and self.ends[p - 1]) or first)
        self.ends.append(last)
        self.rewards.append(reward)
        self.start = max(self.start, self.next - max_length)
        return p

    def begin_of(self, p: int) -> int:
        while not self.begins[p]:
            p -= 1
        return p

    def last_of(self, p: int) -> int:
        q = p
        while q + 1 < self.next and not self.begins[q + 1]:
            q += 1
        return q

    def valid_starts(self, length: int, cross: bool, ignored: int = 0) -> list[int]:
        out = []
        for p in range(self.start + ignored, self.next - length + 1):
            if cross or all(not self.begins[q] for q in range(p + 1, p + length)):
                out.append(p)
        return out


def make_batch(envs: np.ndarray, positions: np.ndarray, done: np.ndarray, rewards=None):
    batch = {
        "env": envs.astype(np.int64),
        "pos": positions.astype(np.int64),
        "done": done.astype(bool),
        "obs": np.stack([envs * 1000.0 + positions, -positions], axis=1).astype(np.float32),
    }
    if rewards is not None:
        batch["reward"] = np.asarray(rewards, dtype=np.float32)
    return batch


def check_window_data(data, info, models, length, cross):
    for w, (e, p) in enumerate(zip(info.env_ids.tolist(), info.positions.tolist(), strict=True)):
        assert data["env"][w].tolist() == [e] * length, "a window mixes environments"
        assert data["pos"][w].tolist() == list(range(p, p + length)), "steps not consecutive"
        assert data["obs"][w, :, 0].tolist() == [e * 1000.0 + q for q in range(p, p + length)]
        model = models[e]
        assert model.start <= p and p + length <= model.next, "a window holds evicted steps"
        if not cross:
            assert model.begin_of(p) == model.begin_of(p + length - 1), "window crosses episodes"


# -- the reference-model test ---------------------------------------------------------------

OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("add"),
            st.lists(st.integers(0, 2), min_size=1, max_size=3, unique=True),
            st.lists(st.sampled_from([MID, MID, MID, FIRST, LAST]), min_size=3, max_size=3),
        ),
        st.tuples(st.just("sample"), st.integers(1, 4), st.booleans()),
        st.tuples(st.just("dequeue"), st.integers(1, 3), st.integers(0, 2)),
        st.tuples(st.just("query"), st.integers(0, 2)),
    ),
    min_size=1,
    max_size=40,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ops=OPS,
    max_length=st.integers(1, 7),
    cross=st.booleans(),
    ignored=st.integers(0, 2),
    prioritized=st.booleans(),
)
def test_matches_reference_model(client, ops, max_length, cross, ignored, prioritized):
    client.flushall()
    buf = SequenceBuffer(
        client,
        "model",
        3,
        max_length,
        step_type_field="step_type",
        allow_cross_episode=cross,
        num_earliest_frames_ignored=ignored,
        prioritized_sampling=prioritized,
        seed=1,
    )
    models = [EnvModel() for _ in range(3)]
    for op in ops:
        if op[0] == "add":
            envs = np.array(op[1])
            types = np.array(op[2][: len(envs)])
            positions = np.array([models[e].next for e in envs])
            batch = make_batch(envs, positions, types == LAST)
            batch["step_type"] = types.astype(np.int32)
            got = buf.add_batch(batch, env_ids=envs)
            expected = [
                models[e].add(t == FIRST, t == LAST, 0.0, max_length)
                for e, t in zip(envs.tolist(), types.tolist(), strict=True)
            ]
            assert got.tolist() == expected
        elif op[0] == "sample":
            length, _ = op[1], op[2]
            valid = {
                (e, p) for e, m in enumerate(models) for p in m.valid_starts(length, cross, ignored)
            }
            if not valid:
                with pytest.raises(EmptyBufferError):
                    buf.get_batch(2, length)
                continue
            if prioritized:  # independent draws among valid windows
                data, info = buf.get_batch(4, length)
                check_window_data(data, info, models, length, cross)
                drawn = set(zip(info.env_ids.tolist(), info.positions.tolist(), strict=True))
                assert drawn <= valid
                buf.update_priority(info.env_ids, info.positions, np.arange(1.0, 5.0))
                continue
            # all valid windows, without replacement: the batch must be exactly that set
            data, info = buf.get_batch(len(valid), length)
            check_window_data(data, info, models, length, cross)
            drawn = set(zip(info.env_ids.tolist(), info.positions.tolist(), strict=True))
            assert drawn == valid
        elif op[0] == "dequeue":
            n, e = op[1], op[2]
            model = models[e]
            if model.next - model.start < n:
                before = snapshot(client, "model")
                with pytest.raises(EmptyBufferError):
                    buf.dequeue(n, [e])
                assert snapshot(client, "model") == before
                continue
            data = buf.dequeue(n, [e])
            assert data["pos"].tolist() == [list(range(model.start, model.start + n))]
            model.start += n
        else:
            e = op[1]
            model = models[e]
            stored = list(range(model.start, model.next))
            assert buf.env_range(e) == (model.start, model.next)
            if stored:
                begin = buf.get_episode_begin_position(stored, [e] * len(stored))
                assert begin.tolist() == [model.begin_of(p) for p in stored]
                to_end = buf.steps_to_episode_end(stored, [e] * len(stored))
                assert to_end.tolist() == [model.last_of(p) - p for p in stored]
                pos = buf.get_field("pos", [e] * len(stored), stored)
                assert pos.tolist() == stored
    assert len(buf) == sum(m.next - m.start for m in models)


def snapshot(client, name: str) -> dict[str, object]:
    out: dict[str, object] = {}
    for key in SequenceKeys(name).all_keys():
        kind = client.type(key).decode()
        if kind == "hash":
            value: object = sorted(client.hgetall(key).items())
        elif kind == "zset":
            value = client.zrange(key, 0, -1, withscores=True)
        else:
            value = None
        out[key] = (kind, value)
    return out


# -- scenarios on both servers ------------------------------------------------------------


def fill(buf: SequenceBuffer, steps: int, num_envs: int, episode: int = 0, rng=None):
    for t in range(steps):
        envs = np.arange(num_envs)
        done = (
            np.zeros(num_envs, dtype=bool) if not episode else (t + envs) % episode == episode - 1
        )
        if rng is not None:
            done = rng.random(num_envs) < 0.2
        buf.add_batch(make_batch(envs, np.full(num_envs, t), done))


@pytest.mark.parametrize(
    "length, replacement, batch, calls",
    [
        (3, True, 50, 40),
        (5, True, 50, 40),
        (1, True, 50, 40),
        (3, False, 4, 250),
        (5, False, 2, 500),
    ],
)
def test_uniform_draws_are_uniform_over_valid_windows(
    client, buffer_name, length, replacement, batch, calls
):
    """L=3: rejection sampling suffices; L=5: it often runs out (one valid start per
    episode) and the exact enumeration draws; L=1: every stored step. Without
    replacement, each batch holds distinct windows."""
    buf = SequenceBuffer(
        client, buffer_name, 2, 10, done_field="done", with_replacement=replacement, seed=3
    )
    fill(buf, 14, 2, episode=5)
    models = [EnvModel(start=4) for _ in range(2)]
    for e, m in enumerate(models):
        m.begins = [t == 0 or (t - 1 + e) % 5 == 4 for t in range(14)]
        m.ends = [(t + e) % 5 == 4 for t in range(14)]
    valid = [(e, p) for e in range(2) for p in models[e].valid_starts(length, False)]
    counts: Counter = Counter()
    for _ in range(calls):
        data, info = buf.get_batch(batch, length)
        check_window_data(data, info, models, length, False)
        pairs = list(zip(info.env_ids.tolist(), info.positions.tolist(), strict=True))
        if not replacement:
            assert len(set(pairs)) == batch
        counts.update(pairs)
    assert set(counts) == set(valid)
    expected = batch * calls / len(valid)
    chi2 = sum((counts[w] - expected) ** 2 / expected for w in valid)
    # df = len(valid) - 1 <= 19; 45 is beyond the 0.999 quantile of df 19 (43.8)
    assert chi2 < 45, counts


def test_without_replacement_windows_are_distinct(client, buffer_name):
    buf = SequenceBuffer(client, buffer_name, 3, 20, seed=0)
    fill(buf, 20, 3)
    _, info = buf.get_batch(40, 5)
    pairs = list(zip(info.env_ids.tolist(), info.positions.tolist(), strict=True))
    assert len(set(pairs)) == 40


def test_schema_and_bad_input_leave_keys_unchanged(client, buffer_name):
    buf = SequenceBuffer(client, buffer_name, 2, 4, done_field="done")
    fill(buf, 3, 2)
    before = snapshot(client, buffer_name)
    good = make_batch(np.arange(2), np.array([3, 3]), np.zeros(2))
    with pytest.raises(SchemaError):
        buf.add_batch({**good, "obs": good["obs"].astype(np.float64)})
    with pytest.raises(InvalidBatchError):
        buf.add_batch(good, env_ids=[0, 0])
    with pytest.raises(InvalidBatchError):
        buf.add_batch(good, env_ids=[0, 2])
    with pytest.raises(InvalidBatchError):
        buf.add_batch({**good, "pos": np.arange(3)})
    with pytest.raises(InvalidBatchError):
        buf.add_batch({k: v for k, v in good.items() if k != "done"})
    assert snapshot(client, buffer_name) == before
    with pytest.raises(ConfigMismatchError):
        SequenceBuffer(client, buffer_name, 2, 5, done_field="done")
    with pytest.raises(EmptyBufferError):
        buf.get_batch(1, 4)


def test_gather_all_dequeue_and_nested_fields(client, buffer_name):
    buf = SequenceBuffer(client, buffer_name, 2, 3)
    for t in range(5):
        buf.add_batch({"pos": np.array([t, t]), "o": {"x": np.full((2, 2), t, dtype=np.int16)}})
    data, info = buf.gather_all()
    assert data["pos"].tolist() == [[2, 3, 4], [2, 3, 4]]
    assert data["o"]["x"].shape == (2, 3, 2) and data["o"]["x"].dtype == np.int16
    assert info.positions.tolist() == [2, 2]
    assert buf.get_field("o.x", [1], [4]).tolist() == [[4, 4]]
    skipping = SequenceBuffer(client, buffer_name, 2, 3, num_earliest_frames_ignored=2)
    data, info = skipping.gather_all(ignore_earliest_frames=True)
    assert data["pos"].tolist() == [[4], [4]] and info.positions.tolist() == [4, 4]
    data = buf.dequeue(2, [1])
    assert data["pos"].tolist() == [[2, 3]]
    with pytest.raises(InvalidBatchError):
        buf.gather_all()  # env 0 holds 3 steps, env 1 holds 1
    with pytest.raises(KeyError):
        buf.get_field("pos", [1], [2])


def test_get_steps_and_contains_read_steps_by_environment_and_position(client, buffer_name):
    buf = SequenceBuffer(client, buffer_name, 2, 3)
    for t in range(5):
        buf.add_batch({"pos": np.array([t, 10 + t]), "o": {"x": np.full((2, 2), t, np.int16)}})
    steps = buf.get_steps([1, 0, 1], [4, 2, 3])
    assert steps["pos"].tolist() == [14, 2, 13]
    assert steps["o"]["x"].shape == (3, 2) and steps["o"]["x"].dtype == np.int16
    # positions 0 and 1 were evicted (3 kept per environment), 5 not written yet
    assert buf.contains([0, 0, 1, 1], [1, 2, 4, 5]).tolist() == [False, True, True, False]
    with pytest.raises(KeyError, match="0:1"):
        buf.get_steps([0, 0], [2, 1])
    with pytest.raises(InvalidBatchError):
        buf.get_steps([0, 1], [2])
    with pytest.raises(ValueError):
        buf.get_steps([], [])


# -- discounted returns ---------------------------------------------------------------------


def reference_returns(rewards, ends, gamma, clip, default):
    """ALF's convention per episode: G(last) = default, G(t) = clip(r(t+1)) + gamma G'(t+1)
    with G'(last) = 0; steps of unfinished episodes keep default."""
    out = np.full(len(rewards), default, dtype=np.float64)
    r = np.clip(np.asarray(rewards, dtype=np.float64), *clip) if clip else np.asarray(rewards)
    begin = 0
    for t, end in enumerate(ends):
        if end:
            g = 0.0
            for s in range(t - 1, begin - 1, -1):
                g = r[s + 1] + gamma * g
                out[s] = g
            begin = t + 1
    return out


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seed=st.integers(0, 2**31),
    gamma=st.floats(0.0, 1.0),
    clip=st.one_of(st.none(), st.tuples(st.floats(-2, 0), st.floats(0, 2))),
)
def test_discounted_returns_match_numpy(client, seed, gamma, clip):
    client.flushall()
    rng = np.random.default_rng(seed)
    steps = 40
    rewards = rng.normal(0, 2, size=(steps, 2)).astype(np.float32)
    ends = rng.random((steps, 2)) < 0.15
    buf = SequenceBuffer(
        client,
        "ret",
        2,
        steps,
        done_field="done",
        record_episodic_return=True,
        gamma=gamma,
        reward_clip=clip,
        default_return=-77.0,
    )
    for t in range(steps):
        buf.add_batch(make_batch(np.arange(2), np.full(2, t), ends[t], rewards[t]))
    data, _ = buf.gather_all()
    for e in range(2):
        expected = reference_returns(rewards[:, e], ends[:, e], gamma, clip, -77.0)
        np.testing.assert_allclose(data["discounted_return"][e], expected, rtol=1e-5, atol=1e-4)
        got = buf.get_field("discounted_return", [e] * steps, list(range(steps)))
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)
    batch, info = buf.get_batch(5, 2)
    for w in range(5):
        e, p = int(info.env_ids[w]), int(info.positions[w])
        expected = reference_returns(rewards[:, e], ends[:, e], gamma, clip, -77.0)
        np.testing.assert_allclose(
            batch["discounted_return"][w], expected[p : p + 2], rtol=1e-5, atol=1e-4
        )
    assert math.isfinite(float(batch["discounted_return"].sum()))


# -- prioritized draws ----------------------------------------------------------------------


def test_prioritized_draws_follow_first_step_priority(client, buffer_name):
    buf = SequenceBuffer(
        client, buffer_name, 2, 10, prioritized_sampling=True, with_replacement=True, seed=5
    )
    fill(buf, 12, 2)  # each env stores positions 2..11
    priorities = {(e, p): float(1 + (p + 3 * e) % 4) for e in range(2) for p in range(2, 12)}
    keys = sorted(priorities)
    set_count = buf.update_priority(
        [k[0] for k in keys], [k[1] for k in keys], [priorities[k] for k in keys]
    )
    assert set_count == len(keys)
    # positions 0 and 1 were evicted: skipped, as in ALF
    assert buf.update_priority([0, 1], [0, 1], [50.0, 50.0]) == 0
    valid = [(e, p) for e in range(2) for p in range(2, 10)]  # windows of 3 steps
    mass = sum(priorities[w] for w in valid)
    total = sum(priorities.values())
    counts: Counter = Counter()
    for _ in range(30):
        data, info = buf.get_batch(64, 3)
        models = [EnvModel(begins=[p == 0 for p in range(12)], ends=[False] * 12, start=2)] * 2
        check_window_data(data, info, models, 3, True)
        pairs = list(zip(info.env_ids.tolist(), info.positions.tolist(), strict=True))
        counts.update(pairs)
        expected_weights = [priorities[w] * 20 / total for w in pairs]
        np.testing.assert_allclose(info.importance_weights, expected_weights, rtol=1e-5)
    assert set(counts) <= set(valid)
    n = sum(counts.values())
    chi2 = sum(
        (counts[w] - n * priorities[w] / mass) ** 2 / (n * priorities[w] / mass) for w in valid
    )
    assert chi2 < 45, counts  # df = 15; the 0.9999 quantile is about 44


def test_importance_weights_divide_by_the_mean_non_zero_priority(client, buffer_name):
    # ALF: a priority of 0 excludes a window; it must not inflate the other weights
    buf = SequenceBuffer(
        client, buffer_name, 2, 6, prioritized_sampling=True, with_replacement=True, seed=3
    )
    fill(buf, 6, 2)  # positions 0..5 of each env, at priority 1.0
    stored = {(e, p): 1.0 for e in range(2) for p in range(6)}
    zeros = [(0, 1), (0, 3), (1, 0), (1, 4)]
    other = {(0, 2): 4.0, (1, 5): 2.5}
    for key, value in [*((k, 0.0) for k in zeros), *other.items()]:
        buf.update_priority([key[0]], [key[1]], [value])
        stored[key] = value

    def check() -> None:
        nonzero = [v for v in stored.values() if v > 0]
        mean = sum(nonzero) / len(nonzero)
        for _ in range(5):
            _, info = buf.get_batch(32, 1)
            pairs = list(zip(info.env_ids.tolist(), info.positions.tolist(), strict=True))
            assert all(stored[w] > 0 for w in pairs)
            expected = [stored[w] / mean for w in pairs]
            np.testing.assert_allclose(info.importance_weights, expected, rtol=1e-6)

    check()
    # two more steps per env evict positions 0 and 1 (zero and non-zero priorities); the
    # new steps take max(initial, largest priority set) = 4.0
    fill(buf, 2, 2)
    for e in range(2):
        for p in (0, 1):
            del stored[(e, p)]
        for p in (6, 7):
            stored[(e, p)] = 4.0
    check()
    buf.update_priority([0, 1], [7, 7], [0.0, 3.0])  # a zero replaces a non-zero, and back
    stored[(0, 7)], stored[(1, 7)] = 0.0, 3.0
    check()
    buf.dequeue(1)  # removes positions 2 of each env (4.0 and 1.0)
    del stored[(0, 2)], stored[(1, 2)]
    check()


def test_prioritized_initial_priority_dequeue_and_bad_input(client, buffer_name):
    buf = SequenceBuffer(
        client, buffer_name, 1, 8, prioritized_sampling=True, initial_priority=2.0, seed=1
    )
    fill(buf, 4, 1)
    _, info = buf.get_batch(4, 1)
    np.testing.assert_allclose(info.importance_weights, 1.0)  # all steps at 2.0
    buf.update_priority([0], [1], [6.0])
    fill(buf, 1, 1)  # position 4 gets max(2.0, 6.0)
    before = snapshot(client, buffer_name)
    for bad in ([-1.0], [math.nan], [math.inf]):
        with pytest.raises(InvalidBatchError):
            buf.update_priority([0], [0], bad)
    assert snapshot(client, buffer_name) == before
    # dequeue removes the oldest two (priorities 2 and 6) from the priorities
    buf.dequeue(2)
    _, info = buf.get_batch(3, 1)
    stored = {2: 2.0, 3: 2.0, 4: 6.0}
    expected = [stored[p] * 3 / sum(stored.values()) for p in info.positions.tolist()]
    np.testing.assert_allclose(info.importance_weights, expected, rtol=1e-6)
    plain = SequenceBuffer(client, buffer_name + "u", 1, 8)
    fill(plain, 2, 1)
    with pytest.raises(ConfigMismatchError):
        plain.update_priority([0], [0], [1.0])


# -- recent data, ignored frames, replacement ----------------------------------------------


def test_recent_part_starts_among_the_latest_windows(client, buffer_name):
    buf = SequenceBuffer(
        client, buffer_name, 2, 50, recent_data_ratio=0.25, recent_data_steps=2, seed=2
    )
    fill(buf, 30, 2)
    for _ in range(5):
        _, info = buf.get_batch(16, 4)
        recent = info.positions[:4]
        assert ((recent >= 30 - 4 + 1 - 2) & (recent <= 30 - 4)).all(), info
    # ALF draws no separate recent part when ordinary draws would reach recent data
    small = SequenceBuffer(
        client, buffer_name + "s", 1, 50, recent_data_ratio=0.5, recent_data_steps=8, seed=2
    )
    fill(small, 10, 1)
    starts = Counter()
    for _ in range(50):
        starts.update(small.get_batch(4, 4)[1].positions.tolist())
    assert min(starts) == 0


def test_ignored_frames_and_replacement(client, buffer_name):
    buf = SequenceBuffer(client, buffer_name, 1, 6, num_earliest_frames_ignored=2, seed=4)
    fill(buf, 9, 1)  # stores 3..8
    _, info = buf.get_batch(3, 2)  # starts 5, 6, 7: all three, distinct
    assert sorted(info.positions.tolist()) == [5, 6, 7]
    _, info = buf.get_batch(10, 2)  # more than exist: drawn with replacement
    assert set(info.positions.tolist()) <= {5, 6, 7}
    with pytest.raises(EmptyBufferError):
        buf.get_batch(1, 5)


def test_window_evicted_between_draw_and_read_is_drawn_again(client, buffer_name):
    buf = SequenceBuffer(client, buffer_name, 1, 10, seed=0)
    fill(buf, 10, 1)
    read = buf._read_steps
    removed = []

    def racing_read(names, *args, **kwargs):
        if not removed:  # another process evicts a drawn step before our read
            removed.append(names[0])
            client.hdel(SequenceKeys(buffer_name).all_keys()[1], names[0])
        return read(names, *args, **kwargs)

    buf._read_steps = racing_read
    data, info = buf.get_batch(4, 3)
    gone = int(removed[0].split(":")[1])
    assert all(not p <= gone < p + 3 for p in info.positions.tolist())
    assert data["pos"].tolist() == [list(range(p, p + 3)) for p in info.positions.tolist()]


def test_torch_fields_keep_dtype_and_library(client, buffer_name):
    import torch

    buf = SequenceBuffer(client, buffer_name, 2, 4)
    for t in range(3):
        buf.add_batch(
            {
                "h": torch.full((2,), t, dtype=torch.bfloat16),
                "x": torch.full((2, 3), t, dtype=torch.bfloat16),
                "n": torch.tensor([t, t], dtype=torch.int32),
            }
        )
    data, _ = buf.gather_all()
    assert data["h"].dtype == torch.bfloat16 and data["h"].shape == (2, 3)
    assert data["x"].dtype == torch.bfloat16 and data["x"].shape == (2, 3, 3)
    assert data["n"].dtype == torch.int32 and data["n"][1].tolist() == [0, 1, 2]
    assert data["h"][0].float().tolist() == [0.0, 1.0, 2.0]
