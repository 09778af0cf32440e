"""SequenceBuffer's prioritized windows on the prioritized engine (docs/sampling.md, "How
prioritized draws are made"): every change to a step priority is one mass-log entry
naming its slot, a replica following the log holds what a fresh read of the ``prio`` hash
holds, and a draw from a replica that another instance made stale is corrected to the
priorities at the call (holes filled), with importance weights from the priorities then."""

from __future__ import annotations

import numpy as np
import pytest
from test_sampling import chi2, chi2_limit

from redisbuf import ConfigMismatchError, EmptyBufferError, SequenceBuffer
from redisbuf.buffers import sequence as sequence_module
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
    assert (meta[b"tree"], meta[b"tree_mass"], meta[b"per_alpha"], meta[b"per_eps"]) == (
        b"1", b"per", b"1", b"0")
    follower = MassReplica("per")
    follower.load(buf._priorities)  # type: ignore[arg-type]
    model: dict[int, float] = {}  # slot -> priority of the stored step there
    stored: dict[int, tuple[int, int]] = {}  # slot -> (env, pos)
    top = 2.0

    def slot(e: int, p: int) -> int:
        return e * max_length + p % max_length

    def check(entries_added: int, before: int) -> None:
        assert _log_length(buf) == before + entries_added
        follower.sync(buf._priorities)  # type: ignore[arg-type]
        fresh = MassReplica("per")
        fresh.load(buf._priorities)  # type: ignore[arg-type]
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
    real_fill = sequence_module._fill_holes

    def counting_fill(*args, **kwargs):
        filled.append(1)
        return real_fill(*args, **kwargs)

    monkeypatch.setattr(sequence_module, "_fill_holes", counting_fill)
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
        replica = a._priorities._replicas["per"]  # type: ignore[attr-defined]
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


def test_a_sum_tree_buffer_of_an_older_redisbuf_is_refused(fake_client, buffer_name):
    SequenceBuffer(fake_client, buffer_name, 1, 4, prioritized_sampling=True)
    meta = SequenceBuffer(fake_client, buffer_name, 1, 4, prioritized_sampling=True).keys.meta
    fake_client.hdel(meta, "tree", "tree_mass", "per_alpha", "per_eps")
    fake_client.hset(meta, "tree_depth", 1)
    with pytest.raises(ConfigMismatchError, match="sum tree"):
        SequenceBuffer(fake_client, buffer_name, 1, 4, prioritized_sampling=True)
