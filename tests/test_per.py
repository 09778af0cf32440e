"""Prioritized experience replay: PERSampler, update_priority, new-item priorities, the
sum tree under the PER mass rule, and the importance weights. Deterministic rules are
checked against an in-memory model after every step; draws statistically."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from replica_helpers import followed_masses, followed_replica, stored_priorities
from test_bad_input import snapshot

from redisbuf import BufferKeys, PERSampler, PrioritizedSampler, ReplayBuffer
from redisbuf.errors import ConfigMismatchError, EmptyBufferError, InvalidBatchError

PROPERTY = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
FANOUT, WIDTH = 16, 24


def batch(values, rewards=None):
    values = np.asarray(values, dtype=np.float64)
    return {
        "x": values.astype(np.float32)[:, None],
        "log_rewards": values if rewards is None else np.asarray(rewards, dtype=np.float64),
    }


def per_scores(client, name: str) -> dict[int, float]:
    return stored_priorities(client, name)


def leaf_masses(client, name: str) -> dict[int, float]:
    """Item id -> its mass in a sampler's replica that follows the mass log."""
    return followed_masses(client, name, "per")


def assert_matches(client, name: str, model: dict[int, float], alpha: float, eps: float):
    """Redis holds exactly the model's PER priorities, replica masses proportional to
    (p + eps)^alpha, and the exact sum and non-zero count of the priorities."""
    stored = per_scores(client, name)
    assert stored == model
    keys = BufferKeys(name)
    assert {int(m) for m in client.zrange(keys.order, 0, -1)} == set(model)
    masses = leaf_masses(client, name)
    follower = followed_replica(client, name, "per")
    nonzero = [p for p in model.values() if p != 0]
    assert follower.nonzero == len(nonzero)
    assert follower.score_sum == pytest.approx(math.fsum(nonzero), rel=1e-12, abs=1e-12)
    assert set(masses) == set(model)
    expected = {i: (p + eps) ** alpha for i, p in model.items()}
    top = max(expected.values(), default=0.0)
    if top > 0:
        scale = max(masses.values()) / top
        for i, mass in masses.items():
            assert mass == pytest.approx(expected[i] * scale, rel=1e-9, abs=1e-300), i


# -- deterministic rules against a model --------------------------------------------


OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("add"),
            st.lists(st.integers(-3, 3), min_size=1, max_size=5),
            st.one_of(st.none(), st.just("explicit")),
        ),
        st.tuples(
            st.just("update"),
            st.lists(st.integers(1, 40), min_size=1, max_size=8),
            st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 7.25, 1e-3, 30.0]), min_size=8,
                     max_size=8),
        ),
    ),
    min_size=1,
    max_size=12,
)


@PROPERTY
@given(ops=OPS, prioritized_capacity=st.booleans(), eps=st.sampled_from([0.0, 1e-6, 0.5]))
def test_priorities_follow_the_model_after_every_step(
    client, buffer_name, ops, prioritized_capacity, eps
):
    client.flushall()
    alpha, initial, capacity = 0.7, 1.5, 6
    buffer = ReplayBuffer(
        client, buffer_name, capacity=capacity, prioritized_capacity=prioritized_capacity,
        sampler=PERSampler(alpha=alpha, initial_priority=initial, eps=eps),
    )
    model: dict[int, float] = {}
    rewards: dict[int, float] = {}
    order: list[int] = []
    # the new-item rule: the highest priority ever given, or initial (an update is one
    # append: the server does not look up its ids, so a priority given to an id no
    # longer stored raises the running max too)
    running_max = initial
    for op in ops:
        if op[0] == "add":
            values = op[1]
            explicit = [abs(v) * 1.25 for v in values] if op[2] else None
            result = buffer.add(batch(values), priorities=explicit)
            new = result.ids.tolist()
            for k, item_id in enumerate(new):
                model[item_id] = explicit[k] if explicit else running_max
                rewards[item_id] = float(values[k])
                order.append(item_id)
            excess = len(order) - capacity
            if excess > 0:
                if prioritized_capacity:  # lowest log-reward, oldest first: never by PER
                    victims = sorted(order, key=lambda i: (rewards[i], i))[:excess]
                else:
                    victims = order[:excess]
                for victim in victims:
                    order.remove(victim)
                    del model[victim]
                    del rewards[victim]
            assert result.evicted == max(excess, 0)
            running_max = max([running_max, *(explicit or [])])
        else:
            ids, values = op[1], op[2][: len(op[1])]
            latest = dict(zip(ids, values, strict=True))
            updated = buffer.update_priority(ids, values)
            assert updated == len([i for i in latest if i in model])
            for item_id, value in latest.items():
                running_max = max(running_max, value)
                if item_id in model:
                    model[item_id] = value
        assert_matches(client, buffer_name, model, alpha, eps)


def test_new_items_get_the_highest_priority_ever_set(client, buffer_name):
    """The new-item rule is a running max (DI-engine's and TorchRL's): max(initial
    priority, the highest priority set since PER was turned on or the buffer cleared),
    kept in meta ``per_max``, so an add never scans the priorities."""
    buffer = ReplayBuffer(client, buffer_name, capacity=10, sampler=PERSampler(initial_priority=2))
    first = buffer.add(batch([0, 1])).ids
    assert per_scores(client, buffer_name) == {int(i): 2.0 for i in first}
    buffer.update_priority(first, [5.0, 0.25])
    second = buffer.add(batch([3])).ids
    assert per_scores(client, buffer_name)[int(second[0])] == 5.0
    buffer.update_priority(first, [0.5, 0.25])
    buffer.update_priority(second, [1.0])
    third = buffer.add(batch([4]), priorities=[0.75]).ids
    assert per_scores(client, buffer_name)[int(third[0])] == 0.75
    fourth = buffer.add(batch([5])).ids
    assert per_scores(client, buffer_name)[int(fourth[0])] == 5.0  # 5.0 was set once
    assert float(client.hget(BufferKeys(buffer_name).meta, "per_max")) == 5.0
    buffer.clear()
    fifth = buffer.add(batch([6])).ids
    assert per_scores(client, buffer_name)[int(fifth[0])] == 2.0  # cleared: the initial


def test_the_new_item_priority_outlives_the_item_that_set_it(client, buffer_name):
    """Evicting the only item of priority 9 leaves the running max at 9: the next item
    gets 9, not the highest priority present (1)."""
    buffer = ReplayBuffer(client, buffer_name, capacity=1, sampler=PERSampler())
    buffer.add(batch([0]), priorities=[9.0])
    kept = buffer.add(batch([1]), priorities=[1.0]).ids  # evicts the item of priority 9
    assert per_scores(client, buffer_name) == {int(kept[0]): 1.0}
    newest = buffer.add(batch([2])).ids  # evicts the one of priority 1
    assert per_scores(client, buffer_name) == {int(newest[0]): 9.0}


def test_eviction_follows_log_rewards_not_per_priorities(client, buffer_name):
    """With prioritized_capacity, the lowest log-reward goes first whatever its PER
    priority; without it, the oldest goes first."""
    buffer = ReplayBuffer(
        client, buffer_name, capacity=3, prioritized_capacity=True, sampler=PERSampler()
    )
    ids = buffer.add(batch([0, 1, 2], rewards=[-1.0, 5.0, 3.0])).ids.tolist()
    buffer.update_priority(ids, [100.0, 0.0, 0.01])  # item 1: top PER, lowest log-reward
    buffer.add(batch([3], rewards=[4.0]))
    assert ids[0] not in per_scores(client, buffer_name)
    assert set(per_scores(client, buffer_name)) == {ids[1], ids[2], ids[2] + 1}
    fifo = ReplayBuffer(client, buffer_name + "f", capacity=2, sampler=PERSampler())
    old = fifo.add(batch([0, 1], rewards=[9.0, 9.0])).ids.tolist()
    fifo.update_priority(old, [50.0, 0.0])
    fifo.add(batch([2], rewards=[-9.0]))
    assert set(per_scores(client, fifo.name)) == {old[1], old[1] + 1}


def test_update_priority_skips_evicted_ids_and_counts_distinct_ids(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=2, sampler=PERSampler())
    ids = buffer.add(batch([0, 1, 2])).ids.tolist()  # the first is evicted at once
    assert buffer.update_priority([ids[0]], [3.0]) == 0
    assert buffer.update_priority([ids[1], ids[1], ids[2], 999], [1.0, 4.0, 2.0, 5.0]) == 2
    assert per_scores(client, buffer_name) == {ids[1]: 4.0, ids[2]: 2.0}
    assert buffer.update_priority([], []) == 0


def update_args(ids, values) -> list[bytes]:
    """lua/update_priority.lua's arguments: 12-digit ids, big-endian doubles."""
    return [b"".join(b"%012d" % i for i in ids), np.asarray(values, ">f8").tobytes()]


def test_the_script_takes_binary_priorities_checked_in_bulk(client, buffer_name):
    # another client (FCALL rb_update_priority) sends the wire form itself: the script
    # checks it whole, refuses malformed ids and lengths, and reads -0.0 as 0
    buffer = ReplayBuffer(client, buffer_name, capacity=5, sampler=PERSampler())
    ids = buffer.add(batch([0, 1, 2])).ids.tolist()
    keys = BufferKeys(buffer_name)
    reply = buffer._run("update_priority", keys.all_keys(),
                        update_args([ids[0], ids[1], ids[2], ids[0]], [8.0, 2.5, -0.0, 4.0]))
    assert int(reply[2]) == int(reply[1]) + 1  # one entry: its versions before and after
    assert per_scores(client, buffer_name) == {ids[0]: 4.0, ids[1]: 2.5, ids[2]: 0.0}
    assert float(client.hget(keys.meta, "per_max")) == 8.0  # 8 was given, then overridden
    before = snapshot(client, buffer_name)
    packed, values = update_args(ids[:2], [1.0, 2.0])
    for bad, match in (([packed[:-1], values], "12 decimal digits"),
                       ([packed[:11] + b"x" + packed[12:], values], "12 decimal digits"),
                       ([packed, values[:-8]], "8 bytes of priorities for 2 ids")):
        with pytest.raises(InvalidBatchError, match=match):
            buffer._run("update_priority", keys.all_keys(), bad)
    assert snapshot(client, buffer_name) == before


@pytest.mark.parametrize("bad", [math.nan, -1.0, math.inf, -math.inf])
def test_bad_priorities_raise_and_change_nothing(client, buffer_name, bad):
    buffer = ReplayBuffer(client, buffer_name, capacity=5, sampler=PERSampler())
    ids = buffer.add(batch([0, 1, 2])).ids
    before = snapshot(client, buffer_name)
    with pytest.raises(InvalidBatchError, match="priorit"):
        buffer.update_priority(ids, [1.0, bad, 2.0])
    with pytest.raises(InvalidBatchError, match="priorit"):
        buffer.add(batch([4, 5]), priorities=[1.0, bad])
    assert snapshot(client, buffer_name) == before
    # the script refuses on its own too (another client could skip the Python checks)
    keys = BufferKeys(buffer_name)
    with pytest.raises(InvalidBatchError, match="priority 1"):
        buffer._run("update_priority", keys.all_keys(), update_args(ids[:2], [1.0, bad]))
    assert snapshot(client, buffer_name) == before


def test_wrong_lengths_and_missing_per_are_refused(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=5, sampler=PERSampler())
    ids = buffer.add(batch([0, 1])).ids
    with pytest.raises(InvalidBatchError, match="2 priorities for 1 items"):
        buffer.update_priority(ids[:1], [1.0, 2.0])
    plain = ReplayBuffer(client, buffer_name + "p", capacity=5)
    plain.add(batch([0]))
    with pytest.raises(ConfigMismatchError, match="PER"):
        plain.update_priority([1], [1.0])
    with pytest.raises(ConfigMismatchError, match="PERSampler"):
        plain.add(batch([1]), priorities=[1.0])


def test_per_settings_are_the_buffers(client, buffer_name):
    ReplayBuffer(client, buffer_name, capacity=5, sampler=PERSampler(alpha=0.6))
    ReplayBuffer(client, buffer_name, capacity=5, sampler=PERSampler(alpha=0.6, beta=1.0))
    with pytest.raises(ConfigMismatchError, match="alpha=0.6"):
        ReplayBuffer(client, buffer_name, capacity=5, sampler=PERSampler(alpha=0.5))
    with pytest.raises(ConfigMismatchError, match="PERSampler"):
        ReplayBuffer(client, buffer_name, capacity=5, sampler=PrioritizedSampler())
    ReplayBuffer(client, buffer_name + "s", capacity=5, prioritized_sampling=True)
    with pytest.raises(ConfigMismatchError, match="softmax"):
        ReplayBuffer(client, buffer_name + "s", capacity=5, sampler=PERSampler())
    for bad in ({"alpha": -1}, {"beta": math.nan}, {"eps": math.inf}, {"initial_priority": -2}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            PERSampler(**bad)


def test_per_on_a_filled_buffer_gives_present_items_the_initial_priority(client, buffer_name):
    plain = ReplayBuffer(client, buffer_name, capacity=5)
    ids = plain.add(batch([0, 1, 2])).ids.tolist()
    ReplayBuffer(client, buffer_name, capacity=5, sampler=PERSampler(initial_priority=3.0))
    assert_matches(client, buffer_name, {i: 3.0 for i in ids}, 0.6, 1e-6)


def test_clear_and_drop_reset_per_state(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=5, sampler=PERSampler(), seed=1)
    ids = buffer.add(batch([0, 1])).ids
    buffer.update_priority(ids, [4.0, 9.0])
    buffer.clear()
    assert_matches(client, buffer_name, {}, 0.6, 1e-6)
    with pytest.raises(EmptyBufferError):
        buffer.sample(1)
    new = buffer.add(batch([0])).ids.tolist()
    assert_matches(client, buffer_name, {new[0]: 1.0}, 0.6, 1e-6)
    buffer.drop()
    ReplayBuffer(client, buffer_name, capacity=5).add(batch([1]))
    assert len(buffer.sample(2)["x"]) == 2  # the sampler turns PER back on


# -- distributions -----------------------------------------------------------------


def chi2_limit(df: int, z: float = 5.0) -> float:
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_draws_follow_priority_to_the_alpha(client, buffer_name, alpha):
    eps = 0.01
    sampler = PERSampler(alpha=alpha, eps=eps)
    buffer = ReplayBuffer(client, buffer_name, capacity=64, sampler=sampler, seed=7)
    ids = buffer.add(batch(np.arange(12))).ids
    priorities = np.array([0, 0.1, 0.5, 1, 2, 3, 4, 6, 8, 10, 12, 0.05])
    buffer.update_priority(ids, priorities)
    mass = (priorities + eps) ** alpha
    p = mass / mass.sum()
    counts = dict.fromkeys(ids.tolist(), 0)
    draws = 24000
    for _ in range(draws // 1000):
        info = buffer.sample_with_info(1000)
        for item_id in info.ids.tolist():
            counts[item_id] += 1
        index = {int(i): k for k, i in enumerate(ids)}
        expected_p = np.array([p[index[i]] for i in info.ids.tolist()])
        np.testing.assert_allclose(info.probabilities, expected_p, rtol=1e-9)
    observed = np.array([counts[i] for i in ids.tolist()], dtype=float)
    chi2 = float(((observed - p * draws) ** 2 / (p * draws)).sum())
    assert chi2 < chi2_limit(len(ids) - 1), (observed, p * draws)


def test_weights_follow_the_formulas_and_beta_can_change(client, buffer_name):
    sampler = PERSampler(alpha=0.7, beta=0.4, eps=1e-6)
    buffer = ReplayBuffer(client, buffer_name, capacity=16, sampler=sampler, seed=3)
    ids = buffer.add(batch(np.arange(6))).ids
    priorities = np.array([0.0, 0.2, 1.0, 3.0, 5.0, 0.5])
    buffer.update_priority(ids, priorities)
    mass = (priorities + 1e-6) ** 0.7
    prob = mass / mass.sum()
    n_items = len(ids)
    index = {int(i): k for k, i in enumerate(ids)}
    mean_nonzero = priorities[priorities > 0].mean()
    for beta in (0.4, 1.0, 0.0):
        sampler.beta = beta
        info = buffer.sample_with_info(200)
        k = np.array([index[i] for i in info.ids.tolist()])
        raw = (n_items * prob[k]) ** -beta
        np.testing.assert_allclose(
            info.weights, raw / ((n_items * prob.min()) ** -beta), rtol=1e-9
        )
        np.testing.assert_allclose(info.importance_weights, priorities[k] / mean_nonzero,
                                   rtol=1e-12)
    assert (info.weights == 1.0).all()


def test_zero_priorities_are_never_drawn_without_eps(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=8, sampler=PERSampler(eps=0.0), seed=2)
    ids = buffer.add(batch(np.arange(4))).ids
    buffer.update_priority(ids, [0.0, 0.0, 1.0, 4.0])
    info = buffer.sample_with_info(500)
    assert set(info.ids.tolist()) <= {int(ids[2]), int(ids[3])}
    # the largest weight belongs to the lowest priority that can be drawn (1.0)
    assert info.weights.max() == pytest.approx(1.0)
    buffer.update_priority(ids, [0.0, 0.0, 0.0, 0.0])
    with pytest.raises(EmptyBufferError):
        buffer.sample(1)


def test_the_add_script_refuses_bad_per_priorities_before_writing(client, buffer_name):
    """Another client skipping the Python checks still cannot write half a batch."""
    import json

    buffer = ReplayBuffer(client, buffer_name, capacity=5, sampler=PERSampler())
    buffer.add(batch([0, 1]))
    before = snapshot(client, buffer_name)
    blob = client.hget(BufferKeys(buffer_name).items, b"%012d" % 1)
    schema = client.hget(BufferKeys(buffer_name).meta, "schema")
    for bad, error in ((["1", "-2"], InvalidBatchError), (["nan", "1"], InvalidBatchError),
                       (["1"], InvalidBatchError)):
        args = [schema, 2, json.dumps({"per_priorities": bad}), blob, "0", blob, "0"]
        with pytest.raises(error, match="priorit"):
            buffer._run("add", BufferKeys(buffer_name).all_keys(), args)
        assert snapshot(client, buffer_name) == before
    plain = ReplayBuffer(client, buffer_name + "p", capacity=5)
    plain.add(batch([0]))
    before = snapshot(client, plain.name)
    args = [schema, 1, json.dumps({"per_priorities": ["1"]}), blob, "0"]
    with pytest.raises(ConfigMismatchError, match="PERSampler"):
        plain._run("add", BufferKeys(plain.name).all_keys(), args)
    assert snapshot(client, plain.name) == before


def _draw_counts(buffer, ids, draws: int) -> np.ndarray:
    counts = dict.fromkeys((int(i) for i in ids), 0)
    for _ in range(draws // 1000):
        for item_id in buffer.sample_with_info(1000).ids.tolist():
            counts[item_id] += 1
    return np.array([counts[int(i)] for i in ids], dtype=float)


def test_draws_follow_priorities_after_evictions_reuse_slots(client, buffer_name):
    """Evicted items' slots are handed to the items of the same add, the rest to the free
    list for later adds: after many such adds and an update the draws still follow the
    PER distribution over exactly the items present, and the slot maps agree."""
    alpha, eps = 0.8, 0.01
    buffer = ReplayBuffer(
        client,
        buffer_name,
        capacity=40,
        prioritized_capacity=True,  # new items may go at once: slots go to the free list
        sampler=PERSampler(alpha=alpha, eps=eps),
        seed=11,
    )
    rng = np.random.default_rng(5)
    for _ in range(9):
        n = int(rng.integers(5, 25))
        buffer.add(batch(np.arange(n), rng.normal(size=n)), priorities=rng.uniform(0, 5, n))
    per = per_scores(client, buffer_name)
    ids = np.array(sorted(per))
    buffer.update_priority(ids[::2], rng.uniform(0, 5, len(ids[::2])))
    per = per_scores(client, buffer_name)
    assert set(leaf_masses(client, buffer_name)) == set(per)
    mass = np.array([(per[int(i)] + eps) ** alpha for i in ids])
    p = mass / mass.sum()
    draws = 30000
    observed = _draw_counts(buffer, ids, draws)
    chi2 = float(((observed - p * draws) ** 2 / (p * draws)).sum())
    assert chi2 < chi2_limit(len(ids) - 1), (observed, p * draws)




def test_priorities_for_a_buffer_without_per_are_refused_before_any_blob_is_sent(
    client, buffer_name
):
    buffer = ReplayBuffer(client, buffer_name, capacity=10)
    with pytest.raises(ConfigMismatchError, match="needs PERSampler"):
        buffer.add({"obs": np.arange(3.0), "log_rewards": np.zeros(3)}, priorities=np.ones(3))
    assert len(buffer) == 0 and client.hlen(buffer.keys.items) == 0
    assert client.hget(buffer.keys.meta, "last_id") in (b"0", None)  # no id reserved


def test_an_add_with_priorities_is_two_round_trips(real_client, buffer_name, monkeypatch):
    import redis.connection

    buffer = ReplayBuffer(real_client, buffer_name, capacity=100, sampler=PERSampler())
    batch = {"obs": np.arange(4.0), "log_rewards": np.zeros(4)}
    buffer.add(batch, priorities=np.ones(4))  # the scripts are on the server now
    sent: list[int] = []
    send = redis.connection.Connection.send_packed_command

    def counted(self, command, *args, **kwargs):
        sent.append(1)
        return send(self, command, *args, **kwargs)

    monkeypatch.setattr(redis.connection.Connection, "send_packed_command", counted)
    buffer.add(batch, priorities=np.full(4, 2.0))
    assert len(sent) == 2  # the reservation, then the MULTI/EXEC that stores the batch


@pytest.mark.parametrize("max_use", [None, 2])
def test_a_commit_says_the_uses_length_and_max_use_it_left(client, buffer_name, max_use):
    # what a read right after the commit would find: each draw's item's uses (-1 for an
    # item the commit removed at max_use), the buffer's length and its max_use
    buffer = ReplayBuffer(client, buffer_name, capacity=64, sampler=PERSampler(), seed=3,
                          max_use=max_use)
    buffer.add(batch(np.arange(6)))
    keys = BufferKeys(buffer_name)
    for _ in range(4):
        if not client.zcard(keys.order):
            break
        draw = buffer._draw_admitted(5, True, None)
        assert draw.after is not None
        uses, length, said_max_use = draw.after
        assert said_max_use == max_use
        assert length == client.zcard(keys.order)
        read = client.hmget(keys.uses, [b"%012d" % i for i in draw.ids])
        assert uses == [-1 if u is None else int(u) for u in read]
        repeats = {i: draw.ids.count(i) for i in draw.ids}
        for item_id, item_uses in zip(draw.ids, uses, strict=True):
            if item_uses == -1:  # removed by this draw: it reached max_use here
                assert max_use is not None and not client.hexists(keys.items,
                                                                   b"%012d" % item_id)
            else:
                assert item_uses >= repeats[item_id]
                assert max_use is None or item_uses < max_use
