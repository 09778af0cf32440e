"""``update_priority`` is one append of a V entry (lua/update_priority.lua; a U entry when
another language sends text ids): the server
reads no item whatever the caller's replica holds; the caller's replica applies the
entry (directly when it was the only change, else through the entries the reply carries)
and counts the ids stored at its point of the log; a sampler behind corrects its draw by
V and U entries as by C ones (lua/_correct.lua)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from replica_helpers import stored_priorities

from redisbuf import BufferKeys, PERSampler, ReplayBuffer
from redisbuf.buffers.priorities import PER_SUM_CAP
from redisbuf.sampling import commits
from redisbuf.sampling.replica import replica_of


def batch(n: int) -> dict:
    return {"x": np.arange(n, dtype=np.float32), "log_rewards": np.zeros(n)}


def last_entry(client, name: str) -> bytes:
    return client.lindex(BufferKeys(name).masslog, -1)


def per_state(client, name: str, replica=None) -> tuple[dict[int, float], float, int, float]:
    """The stored priorities (as the server reads them), the sum (capped) and non-zero
    count of a replica's (``replica``, else a new one reading the buffer) and meta's
    per_max."""
    buffer = ReplayBuffer(client, name, capacity=None)
    if replica is None:
        replica = replica_of(buffer.view, "per")
    with replica.lock:
        replica.sync(buffer.view)
        total, nonzero = replica.score_sum, replica.nonzero
    top = float(client.hget(BufferKeys(name).meta, "per_max"))
    return stored_priorities(client, name), total, nonzero, top


def test_a_current_replica_updates_with_one_append(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=10, sampler=PERSampler(), seed=1)
    ids = buffer.add(batch(6)).ids.tolist()
    buffer.sample(2)  # the replica is current from here
    # a repeated id (the last wins), an id never stored, a zero, a subnormal, a huge one
    assert buffer.update_priority(
        [ids[0], ids[1], 999, ids[0], ids[2], ids[3]], [2.0, 0.0, 7.0, 0.25, 5e-324, 1e300]
    ) == 4
    assert last_entry(client, buffer_name).startswith(b"V|5|")  # 999 too: not looked up
    per, total, nonzero, top = per_state(client, buffer_name)
    assert per == {ids[0]: 0.25, ids[1]: 0.0, ids[2]: 5e-324, ids[3]: 1e300,
                   ids[4]: 1.0, ids[5]: 1.0}
    capped = [min(v, PER_SUM_CAP) for v in per.values()]  # 1e300 counts as 2^990 there
    assert total == math.fsum(capped) and nonzero == 5 and top == 1e300
    replica = replica_of(buffer.view, "per")
    assert replica.version == int(client.hget(BufferKeys(buffer_name).meta, "log_version"))
    held = replica.slots_of(np.array(ids))
    assert replica.scores[held].tolist() == [per[i] for i in ids]
    # back from 1e300: the replica's sums follow the scores
    assert buffer.update_priority([ids[3], ids[1]], [3.0, 0.5]) == 2
    per, total, nonzero, _ = per_state(client, buffer_name, replica)
    assert total == pytest.approx(math.fsum(per.values()), rel=1e-12) and nonzero == 6


def test_a_replica_behind_catches_up_from_the_reply(client, buffer_name):
    mine = ReplayBuffer(client, buffer_name, capacity=10, sampler=PERSampler(), seed=1)
    ids = mine.add(batch(3)).ids.tolist()
    mine.sample(2)
    other = ReplayBuffer(client, buffer_name, capacity=10, sampler=PERSampler())
    added = other.add(batch(1)).ids.tolist()[0]  # mine's replica does not hold it yet
    assert mine.update_priority([added, ids[0]], [6.0, 4.0]) == 2
    assert last_entry(client, buffer_name).startswith(b"V|2|")
    replica = replica_of(mine.view, "per")
    assert replica.version == int(client.hget(BufferKeys(buffer_name).meta, "log_version"))
    per, total, nonzero, top = per_state(client, buffer_name, replica)
    assert per == {ids[0]: 4.0, ids[1]: 1.0, ids[2]: 1.0, added: 6.0}
    assert total == 12.0 and nonzero == 4 and top == 6.0


@pytest.mark.parametrize("ids_as", ["binary", "text"])
def test_a_sampler_behind_corrects_its_draw_by_update_entries(client, buffer_name, ids_as):
    """Another buffer object cuts a heavy item from 9 to 0.5 right before this one's draw
    of 1, every round: the draw stands at the law after the cut (1/3), reported and
    observed, though the update's entry carries no score from before the cut. Binary ids
    (a V entry) are what update_priority sends; 12-digit text ids (a U entry) what
    rb_update_priority also takes from other languages."""
    per = {"alpha": 1.0, "eps": 0.0}
    sampler = ReplayBuffer(client, buffer_name, capacity=10, sampler=PERSampler(**per), seed=3)
    writer = ReplayBuffer(client, buffer_name, capacity=10, sampler=PERSampler(**per), seed=4)
    ids = sampler.add(batch(3), priorities=[9.0, 0.5, 0.5]).ids.tolist()
    heavy, rounds, hits = ids[0], 300, 0
    cut = [b"%012d" % heavy, np.array([0.5], ">f8").tobytes()]
    for _ in range(rounds):
        sampler.update_priority([heavy], [9.0])
        writer.sample(1)  # the writer's replica is current
        if ids_as == "binary":
            writer.update_priority([heavy], [0.5])
        else:
            writer._run("update_priority", writer.keys.all_keys(), cut)
        kind = b"V" if ids_as == "binary" else b"U"
        assert last_entry(client, buffer_name).startswith(kind + b"|1|")
        info = sampler.sample_with_info(1)
        hits += int(info.ids[0] == heavy)
        assert info.probabilities[0] == pytest.approx(1 / 3)
    assert abs(hits - rounds / 3) < 4.5 * np.sqrt(rounds * (1 / 3) * (2 / 3)), hits / rounds


def test_an_update_whose_replica_another_thread_caught_up_meanwhile(client, buffer_name):
    """The update reads the ids' slots from this process's replica; before its script
    runs, another process adds 2 items that evict 2 (FIFO, capacity 8), and another
    thread of this process (a prefetching reader) catches the replica up. The update's
    own change must then be applied at the ids' slots as they are now: the evicted id it
    names stays absent (the review saw it come back in the replica, then be written to
    the server by the next update from it), and a new id it names gets its priority."""
    per = {"alpha": 1.0, "eps": 0.0}
    learner = ReplayBuffer(client, buffer_name, capacity=8, sampler=PERSampler(**per), seed=1)
    actor = ReplayBuffer(client, buffer_name, capacity=8, sampler=PERSampler(**per), seed=2)
    ids = learner.add(batch(8)).ids.tolist()
    learner.sample(4)  # current
    replica = replica_of(learner.view, "per")
    newest = ids[-1] + 2  # the id the actor's add is about to get last
    run = learner._run

    def interleaved(name, keys, args, *rest):
        if name == "update_priority":
            actor.add(batch(2))  # evicts ids[0] and ids[1]
            replica.sync(learner.view)  # the other thread
        return run(name, keys, args, *rest)

    learner._run = interleaved
    assert learner.update_priority([ids[0], ids[5], newest], [100.0, 3.0, 9.0]) == 2
    learner._run = run
    stored, total, nonzero, _ = per_state(client, buffer_name, replica)
    assert ids[0] not in stored and stored[ids[5]] == 3.0 and stored[newest] == 9.0
    held = replica.slots_of(np.array([ids[0], ids[5], newest]))
    assert held[0] == -1 and replica.scores[held[1:]].tolist() == [3.0, 9.0]
    assert replica.version == int(client.hget(BufferKeys(buffer_name).meta, "log_version"))
    # the next update from the (current) replica keeps the server right
    learner.update_priority([ids[0], ids[6]], [7.0, 1.0])
    stored, total, nonzero, _ = per_state(client, buffer_name, replica)
    assert ids[0] not in stored and set(stored) == set(ids[2:]) | {newest - 1, newest}
    assert total == pytest.approx(math.fsum(stored.values())) and nonzero == 8


def test_a_call_over_one_command_counts_each_distinct_id_once(client, buffer_name):
    """More than MAX_ITEMS_PER_COMMAND ids go as one command per slice; the count is of
    distinct ids across the slices and the last priority of each wins (the review saw
    2049 times one id counted 2)."""
    from redisbuf.store.bounds import MAX_ITEMS_PER_COMMAND

    buffer = ReplayBuffer(client, buffer_name, capacity=10, sampler=PERSampler(), seed=1)
    ids = buffer.add(batch(2)).ids.tolist()
    many = MAX_ITEMS_PER_COMMAND + 1
    assert buffer.update_priority([ids[0]] * many, np.arange(many, dtype=float)) == 1
    cycling = [ids[k % 2] for k in range(2 * many + 2)]
    values = np.arange(len(cycling), dtype=float)
    assert buffer.update_priority(cycling, values) == 2
    stored, total, nonzero, _ = per_state(client, buffer_name, replica_of(buffer.view, "per"))
    assert stored == {ids[0]: values[-2], ids[1]: values[-1]}
    assert total == math.fsum(stored.values()) and nonzero == 2


def test_priorities_near_the_largest_double_keep_draws_and_sums_finite(client, buffer_name):
    """Ten priorities of 1e308 are finite and accepted; their masses would sum past the
    largest double. Draws still return (the review saw the replica's sums overflow and a
    draw spin), the replica's sum of priorities stays finite (each counts as at most
    PER_SUM_CAP there) and comes back exact once the priorities are lowered, and a
    process with a current replica can update them."""
    buffer = ReplayBuffer(client, buffer_name, capacity=20, sampler=PERSampler(alpha=1.0),
                          seed=1)
    ids = buffer.add(batch(12)).ids.tolist()
    assert buffer.update_priority(ids[:10], [1e308] * 10) == 10
    info = buffer.sample_with_info(64, replacement=True)
    assert set(info.ids.tolist()) <= set(ids[:10])
    assert np.isfinite(info.probabilities).all() and np.isfinite(info.weights).all()
    replica = replica_of(buffer.view, "per")
    _, total, nonzero, top = per_state(client, buffer_name, replica)
    assert total == pytest.approx(10 * PER_SUM_CAP + 2.0) and nonzero == 12 and top == 1e308
    assert buffer.update_priority(ids[:10], [0.5] * 10) == 10  # from the current replica
    assert last_entry(client, buffer_name).startswith(b"V|10|")
    stored, total, nonzero, _ = per_state(client, buffer_name, replica)
    assert total == pytest.approx(math.fsum(stored.values()), rel=1e-12) and nonzero == 12
    assert buffer.sample_with_info(8, replacement=True).probabilities.sum() > 0


def test_quiet_commits_send_no_spares_and_a_change_then_still_draws_by_the_law_now(
        client, buffer_name, monkeypatch):
    sent: list[int] = []
    send = commits._DrawCommit.send

    def recorded(self, candidates, spares, uniforms):
        sent.append(spares)
        return send(self, candidates, spares, uniforms)

    monkeypatch.setattr(commits._DrawCommit, "send", recorded)
    buffer = ReplayBuffer(client, buffer_name, capacity=64, sampler=PERSampler(eps=0.0),
                          seed=4)
    ids = buffer.add(batch(20)).ids
    for _ in range(commits._QUIET_COMMITS + 2):
        buffer.sample_with_info(50)
    assert sent[0] > 0 and sent[-1] == 0  # nothing changed: no spares once quiet
    # another process leaves one item with mass: every candidate of the stale replica
    # but that item's is touched, and the commit has no spare to replace it with
    other = ReplayBuffer(client, buffer_name, capacity=64, sampler=PERSampler(eps=0.0))
    other.update_priority(ids[1:], np.zeros(len(ids) - 1))
    del sent[:]
    info = buffer.sample_with_info(50)
    assert set(info.ids.tolist()) == {int(ids[0])}
    np.testing.assert_allclose(info.probabilities, 1.0)
    assert sent[0] == 0 and sent[-1] > 0  # the change brought spares back
    buffer.sample_with_info(10)
    assert sent[-1] > 0
