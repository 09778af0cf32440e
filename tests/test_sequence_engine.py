"""SequenceBuffer's prioritized windows on the prioritized engine (docs/sampling.md, "How
prioritized draws are made"): every change to a step priority is one mass-log entry
naming its slot, a replica following the log holds what a fresh read of the ``prio`` hash
holds, and a draw from a replica that another instance made stale is corrected to the
priorities at the call (holes filled), with importance weights from the priorities then."""

from __future__ import annotations

import numpy as np
import pytest
from seq_peer import SequencePeer
from test_sampling import chi2, chi2_limit

from redisbuf import SequenceBuffer
from redisbuf.errors import EmptyBufferError
from redisbuf.sampling import commits
from redisbuf.sampling.replica import MassReplica


def _add(buf: SequenceBuffer, envs: list[int], done: list[bool] | None = None) -> np.ndarray:
    ids = np.asarray(envs)
    flags = np.zeros(len(envs), dtype=bool) if done is None else np.asarray(done)
    return buf.add_batch({"env": ids, "done": flags}, env_ids=ids)


def _held(replica: MassReplica) -> dict[int, float]:
    where = np.flatnonzero(~np.isnan(replica.scores[: replica.count]))
    return dict(zip(replica.ids[where].tolist(), replica.scores[where].tolist(), strict=True))


def _log_length(buf: SequenceBuffer) -> int:
    return int(buf.client.llen(buf.keys.all_keys()[8]))


def test_each_priority_change_is_one_log_entry_and_replicas_agree(client, buffer_name):
    envs, max_length = 3, 4
    buf = SequenceBuffer(client, buffer_name, envs, max_length, done_field="done",
                         prioritized_sampling=True, initial_priority=2.0)
    meta = client.hgetall(buf.keys.meta)
    assert (meta[b"masslog"], meta[b"mass"], meta[b"per_alpha"], meta[b"per_eps"]) == (
        b"1", b"per", b"1", b"0")
    follower = MassReplica("per")
    follower.load(buf._priorities)
    model: dict[int, float] = {}  # slot -> priority of the stored step there
    stored: dict[int, tuple[int, int]] = {}  # slot -> (env, pos)
    top = 2.0

    def slot(e: int, p: int) -> int:
        return e * max_length + p % max_length

    def check(entries_added: int, before: int) -> None:
        assert _log_length(buf) == before + entries_added
        follower.sync(buf._priorities)
        fresh = MassReplica("per")
        fresh.load(buf._priorities)
        assert _held(follower) == _held(fresh) == model
        raw = {int(k): float(v) for k, v in client.hgetall(buf.keys.all_keys()[7]).items()}
        assert raw == model
        nonzero = [v for v in model.values() if v > 0]
        counts = client.hmget(buf.keys.meta, "nonzero", "prio_sum", "prio_comp")
        assert int(counts[0]) == len(nonzero)
        assert float(counts[1]) + float(counts[2]) == pytest.approx(sum(nonzero), rel=1e-12)

    rng = np.random.default_rng(0)
    nexts = [0] * envs
    starts = [0] * envs
    for step in range(12):
        before = _log_length(buf)
        chosen = sorted(rng.choice(envs, size=int(rng.integers(1, envs + 1)), replace=False))
        positions = _add(buf, [int(e) for e in chosen]).tolist()
        for e, p in zip(chosen, positions, strict=True):
            assert p == nexts[e]
            nexts[e] += 1
            starts[e] = max(starts[e], nexts[e] - max_length)
            model[slot(e, p)] = top  # takes the evicted step's slot, if any
            stored[slot(e, p)] = (e, p)
        check(1, before)  # one entry for the whole batch, evictions included
        before = _log_length(buf)
        e = int(rng.integers(envs))
        if nexts[e] > starts[e]:
            p = int(rng.integers(starts[e], nexts[e]))
            value = float(rng.choice([0.0, 0.5, 3.0 + step]))
            # a repeated step: the last value wins; an evicted position is skipped
            got = buf.update_priority([e, e, e], [p, p, max(starts[e] - 1, -1)],
                                      [9.0, value, 7.0])
            assert got == 2  # both rows of the stored step; the other is not stored
            model[slot(e, p)] = value
            top = max(top, 9.0, value)  # the largest priority ever set
            check(1, before)
        if step % 5 == 4:
            before = _log_length(buf)
            e = int(rng.integers(envs))
            if nexts[e] > starts[e]:
                buf.dequeue(1, [e])
                del model[slot(e, starts[e])]
                starts[e] += 1
                check(1, before)


def test_a_stale_draw_is_corrected_to_the_priorities_at_the_call(client, buffer_name,
                                                                 monkeypatch):
    """B re-scores position 0 between every two draws of A, from 200 down to 0.05 and
    back: A's replica is behind at each call, mostly drawing what is now the wrong window,
    and the server's correction (its holes filled by A) must give the law of the call."""
    a = SequenceBuffer(client, buffer_name, 1, 10, prioritized_sampling=True, seed=11)
    b = SequenceBuffer(client, buffer_name, 1, 10, prioritized_sampling=True)
    _add(a, [0])
    for _ in range(9):
        _add(b, [0])
    b.update_priority([0] * 10, list(range(10)), [1.0] * 10)
    filled = []
    real_fill = commits._fill_holes

    def counting_fill(*args, **kwargs):
        filled.append(1)
        return real_fill(*args, **kwargs)

    monkeypatch.setattr(commits, "_fill_holes", counting_fill)
    a.get_batch(4, 2)  # A's replica is made and current
    counts = {200.0: np.zeros(10), 0.05: np.zeros(10)}
    for call in range(120):
        value = 200.0 if call % 2 == 0 else 0.05
        b.update_priority([0], [0], [value])
        _, info = a.get_batch(32, 2)
        positions = info.positions
        assert ((positions >= 0) & (positions <= 8)).all()  # position 9 starts no window
        np.add.at(counts[value], positions, 1)
        stored = np.ones(10)
        stored[0] = value
        expected_weights = stored[positions] * 10 / stored.sum()
        np.testing.assert_allclose(info.importance_weights, expected_weights, rtol=1e-6)
        replica = a._priorities.replicas["per"]
        assert replica.version == int(client.hget(a.keys.meta, "log_version"))
    assert filled, "no draw had holes to fill: the test did not reach that path"
    for value, got in counts.items():
        law = np.ones(9)
        law[0] = value
        expected = got.sum() * law / law.sum()
        assert got[9] == 0
        assert chi2(got[:9], expected) < chi2_limit(8), (value, got, expected)


def test_a_buffer_dropped_and_made_again_is_read_again(client, buffer_name):
    a = SequenceBuffer(client, buffer_name, 2, 5, prioritized_sampling=True, seed=3)
    for _ in range(5):
        _add(a, [0, 1])
    a.get_batch(8, 1)
    b = SequenceBuffer(client, buffer_name, 2, 5, prioritized_sampling=True)
    b.drop()
    b = SequenceBuffer(client, buffer_name, 2, 5, prioritized_sampling=True)
    for _ in range(3):
        _add(b, [0, 1])
    b.update_priority([0, 0, 0, 1, 1, 1], [0, 1, 2, 0, 1, 2], [0, 0, 0, 0, 5.0, 0])
    data, info = a.get_batch(16, 1)
    assert info.env_ids.tolist() == [1] * 16 and info.positions.tolist() == [1] * 16
    assert data["env"].ravel().tolist() == [1] * 16
    np.testing.assert_allclose(info.importance_weights, 1.0)
    b.update_priority([1], [1], [0.0])
    with pytest.raises(EmptyBufferError, match="non-zero priority"):
        a.get_batch(1, 1)


@pytest.mark.redis_server
@pytest.mark.multiprocess
def test_a_spawned_writer_between_draw_and_commit(redis_server, buffer_name):
    """A spawned process adds a step to one environment and moves a priority of the other
    right after this process drew from its replica and before its commit reaches the
    server: the windows follow the streams and priorities at the commit (the new step
    starts no window of 2 steps yet, the window ending at it is valid now), and the replica
    has caught up afterwards."""
    url = redis_server.url
    options = {"num_environments": 2, "max_length": 6, "prioritized_sampling": True}
    a = SequenceBuffer(url, buffer_name, seed=5, **options)
    peer = SequencePeer(url, buffer_name, **options)
    try:
        for _ in range(4):
            _add(a, [0, 1])  # positions 0..3 of each env, priority 1
        a.get_batch(4, 2)  # A's replica is made and current
        real_run = a._run
        armed = [False]
        moves: list[tuple[int, float, int]] = []  # (position of env 1 moved, value, new pos)

        def racing_run(script, keys, args):
            if script == "seq_sample" and len(args) > 10 and armed[0]:  # a prioritized commit
                armed[0] = False  # the first of the call: the streams stay put afterwards
                value = 50.0 if len(moves) % 2 == 0 else 0.02
                moved = len(moves) % 3
                new = peer("add", envs=[0])[0]
                peer("update_priority", envs=[1], positions=[moved], priorities=[value])
                moves.append((moved, value, new))
            return real_run(script, keys, args)

        a._run = racing_run  # type: ignore[method-assign]
        stored = {(e, p): 1.0 for e in range(2) for p in range(4)}
        top = 1.0  # the largest priority ever set: a new step's
        counts: dict[tuple[int, int], int] = {}
        expected: dict[tuple[int, int], float] = {}
        moved_hits, moved_mean, moved_var = 0, 0.0, 0.0  # draws of the window just moved
        for call in range(40):
            armed[0] = True
            _, info = a.get_batch(16, 2)
            assert len(moves) == call + 1
            moved, value, new = moves[call]
            stored[(0, new)] = top  # added before the priority moved
            stored[(1, moved)] = value
            top = max(top, value)
            start = max(0, new + 1 - 6)
            for gone in [w for w in stored if w[0] == 0 and w[1] < start]:
                del stored[gone]
            valid = [(e, p) for (e, p) in stored if (e, p + 1) in stored]
            law = np.array([stored[w] for w in valid])
            pairs = list(zip(info.env_ids.tolist(), info.positions.tolist(), strict=True))
            assert set(pairs) <= set(valid), (pairs, valid)
            for w, prob in zip(valid, law / law.sum(), strict=True):
                expected[w] = expected.get(w, 0.0) + 16 * prob
            for w in pairs:
                counts[w] = counts.get(w, 0) + 1
            share = stored[(1, moved)] / law.sum()
            moved_hits += pairs.count((1, moved))
            moved_mean += 16 * share
            moved_var += 16 * share * (1 - share)
            nonzero = [v for v in stored.values() if v > 0]
            np.testing.assert_allclose(
                info.importance_weights,
                [stored[w] * len(nonzero) / sum(nonzero) for w in pairs], rtol=1e-6)
            replica = a._priorities.replicas["per"]
            assert replica.version == int(a.client.hget(a.keys.meta, "log_version"))
        # the window whose priority moved just before the commit: drawn by the law after
        # the move (a draw by the law before it would take it about 0 or 40% of the time)
        assert abs(moved_hits - moved_mean) < 5 * moved_var**0.5, (moved_hits, moved_mean)
        keys = sorted(expected)
        got = np.array([counts.get(w, 0) for w in keys], dtype=float)
        want = np.array([expected[w] for w in keys])
        big = want >= 5  # pool the rare windows into one cell
        got = np.append(got[big], got[~big].sum())
        want = np.append(want[big], want[~big].sum())
        assert chi2(got, want) < chi2_limit(len(got) - 1), (got, want)
    finally:
        peer.stop()


@pytest.mark.redis_server
def test_prioritized_windows_on_a_cluster(cluster_client):
    """Every key of a prioritized sequence buffer (the prio hash and the mass log too)
    lives in its name's slot: the replica's reads and the commits run on a cluster."""
    a = SequenceBuffer(cluster_client, "prio-seq", 2, 8, prioritized_sampling=True, seed=0)
    b = SequenceBuffer(cluster_client, "prio-seq", 2, 8, prioritized_sampling=True)
    for _ in range(4):
        _add(a, [0, 1])
    a.get_batch(4, 2)
    b.update_priority([0, 0, 0, 1, 1, 1, 1], [0, 1, 2, 0, 1, 2, 3], [0, 0, 0, 0, 0, 2.0, 0])
    _, info = a.get_batch(8, 2)  # the replica is behind: the draw is corrected
    assert info.env_ids.tolist() == [1] * 8 and info.positions.tolist() == [2] * 8
    # non-zero: 2.0 there and 1.0 on (0, 3), the last step of env 0 (it starts no window)
    np.testing.assert_allclose(info.importance_weights, 2.0 * 2 / 3.0, rtol=1e-6)


def test_a_new_replica_reads_the_snapshot_of_an_earlier_one(client, buffer_name, monkeypatch):
    """The first replica scans the prio hash and publishes a snapshot (rb:{name}:seq:snap);
    the next process's replica reads that and the log after it, not the hash, and holds
    the same priorities; drop() deletes the snapshot with the rest."""
    from redisbuf.sampling import replica as replica_module

    monkeypatch.setattr(replica_module, "_SNAP_MIN_ITEMS", 1)  # snapshots for small ones too
    a = SequenceBuffer(client, buffer_name, 2, 6, prioritized_sampling=True, seed=1)
    for _ in range(8):
        _add(a, [0, 1])
    a.update_priority([0, 1], [3, 4], [5.0, 0.0])
    a.get_batch(4, 1)
    assert client.exists(a.keys.snap)
    a.update_priority([0], [5], [7.0])  # after the snapshot: read from the log
    b = SequenceBuffer(client, buffer_name, 2, 6, prioritized_sampling=True, seed=2)
    ran: list[str] = []
    real_run = b._run

    def spying_run(script, keys, args):
        ran.append(script)
        return real_run(script, keys, args)

    b._run = spying_run  # type: ignore[method-assign]
    _, info = b.get_batch(8, 1)
    assert "seq_replica_read" not in ran and "seq_masslog_read" in ran
    stored = {int(k): float(v) for k, v in client.hgetall(b.keys.all_keys()[7]).items()}
    assert _held(b._priorities.replicas["per"]) == stored
    assert stored[0 * 6 + 5] == 7.0 and stored[1 * 6 + 4] == 0.0
    b.drop()
    assert not any(client.exists(key) for key in b.keys.all_keys())
    assert not list(client.scan_iter(match=b.keys.snap_staging("*")))
