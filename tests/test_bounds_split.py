"""Issue 35 for the sequence buffer and the lifetime rules: reads of many steps go in
commands of at most the bound (redisbuf/store/bounds.py) with the same result, an atomic
removal above the bound is refused having removed nothing, and stale removals go in
bounded commands. Every command the client sends is recorded (at the serializer, so
pipelined commands count one by one) and checked against the bound, which is lowered
here so that small buffers exercise the splits; the scripts keep theirs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import numpy as np
import pytest
import redis.connection
from key_contents import key_contents
from replica_helpers import fresh_replica, replica_scores, stored_priorities

from redisbuf.buffers.sequence import SequenceBuffer, SequenceKeys
from redisbuf.errors import RequestTooLargeError
from redisbuf.store import bounds

BOUND = 6


class Recorder:
    """Every command packed for the server while recording (name, argument count)."""

    def __init__(self) -> None:
        self.commands: list[tuple[str, ...]] = []
        self.on = False

    def fields(self, name: str, key_suffix: str) -> list[int]:
        """Field counts of each recorded ``name`` command on a key ending in ``key_suffix``."""
        return [len(c) - 2 for c in self.commands
                if c[0].upper() == name and str(c[1]).endswith(key_suffix)]

    def scripts(self) -> int:
        return sum(1 for c in self.commands if c[0].upper() in ("EVALSHA", "EVAL", "FCALL"))


@pytest.fixture
def recorder(monkeypatch) -> Iterator[Recorder]:
    rec = Recorder()
    for cls in (redis.connection.PythonRespSerializer, redis.connection.HiredisRespSerializer):
        original = cls.pack

        def pack(self, *args, _original=original):
            if rec.on:
                rec.commands.append(tuple(
                    a.decode(errors="replace") if isinstance(a, bytes) else str(a)
                    for a in args))
            return _original(self, *args)

        monkeypatch.setattr(cls, "pack", pack)
    yield rec


def _steps(buf: SequenceBuffer, envs: int, steps: int, episode: int = 0) -> None:
    for t in range(steps):
        batch = {"pos": np.full(envs, t, dtype=np.int64),
                 "env": np.arange(envs, dtype=np.int64),
                 "reward": np.full(envs, 0.5 + t)}
        if episode:
            batch["done"] = (np.arange(envs) + t) % episode == episode - 1
        buf.add_batch(batch)


@pytest.mark.parametrize("returns", [False, True])
def test_window_reads_are_bounded_and_unchanged(client, buffer_name, recorder, monkeypatch,
                                                returns):
    kwargs = dict(done_field="done", record_episodic_return=returns, gamma=0.5)
    buf = SequenceBuffer(client, buffer_name, 3, 40, seed=5, **kwargs)
    _steps(buf, 3, 40, episode=13)
    expected, expected_info = SequenceBuffer(client, buffer_name, 3, 40, seed=7,
                                             **kwargs).get_batch(9, 4)
    monkeypatch.setattr(bounds, "MAX_ITEMS_PER_COMMAND", BOUND)
    same = SequenceBuffer(client, buffer_name, 3, 40, seed=7, **kwargs)
    recorder.on = True
    data, info = same.get_batch(9, 4)  # 36 steps: 6 commands of one window (4 fields) each
    recorder.on = False
    reads = recorder.fields("HMGET", ":seq:steps")
    assert reads and max(reads) <= BOUND and sum(reads) == 36 and len(reads) == 9
    if returns:
        assert recorder.fields("HMGET", ":seq:returns") == reads
        np.testing.assert_array_equal(data["discounted_return"],
                                      expected["discounted_return"])
        assert (data["discounted_return"] != -1000.0).any()
    for key in ("pos", "env", "reward"):
        np.testing.assert_array_equal(data[key], expected[key])
    np.testing.assert_array_equal(info.positions, expected_info.positions)
    # each window is whole and holds its steps
    assert (data["pos"] == info.positions[:, None] + np.arange(4)).all()
    # a window longer than the bound is read in several commands
    recorder.commands.clear()
    recorder.on = True
    long, long_info = same.get_batch(2, 9)
    recorder.on = False
    reads = recorder.fields("HMGET", ":seq:steps")
    assert max(reads) <= BOUND and sum(reads) == 18
    assert (long["pos"] == long_info.positions[:, None] + np.arange(9)).all()


def test_get_field_is_bounded(client, buffer_name, recorder, monkeypatch):
    buf = SequenceBuffer(client, buffer_name, 2, 30)
    _steps(buf, 2, 30)
    monkeypatch.setattr(bounds, "MAX_ITEMS_PER_COMMAND", BOUND)
    envs, positions = np.repeat([0, 1], 20), np.tile(np.arange(5, 25), 2)
    recorder.on = True
    got = buf.get_field("pos", envs, positions)
    recorder.on = False
    assert got.tolist() == positions.tolist()
    reads = recorder.fields("HMGET", ":seq:steps")
    assert max(reads) <= BOUND and sum(reads) == 40


@pytest.mark.parametrize("returns", [False, True])
def test_gather_all_above_the_bound_reads_in_parts_the_same(client, buffer_name, recorder,
                                                           monkeypatch, returns):
    kwargs = dict(done_field="done", record_episodic_return=returns,
                  num_earliest_frames_ignored=2)
    buf = SequenceBuffer(client, buffer_name, 3, 8, **kwargs)
    _steps(buf, 3, 11, episode=4)  # 3 evicted per env: 8 stored each
    expected, expected_info = buf.gather_all(ignore_earliest_frames=True)  # one script
    assert expected["pos"].shape == (3, 6)
    monkeypatch.setattr(bounds, "MAX_ITEMS_PER_COMMAND", BOUND)
    recorder.on = True
    data, info = buf.gather_all(ignore_earliest_frames=True)
    recorder.on = False
    assert recorder.scripts() == 0  # 18 steps > 6: read by the client in parts
    reads = recorder.fields("HMGET", ":seq:steps")
    assert max(reads) <= BOUND and sum(reads) == 18
    assert max(recorder.fields("HMGET", ":seq:envs")) <= BOUND
    for key in expected:
        np.testing.assert_array_equal(data[key], expected[key])
    for a, b in zip(info, expected_info, strict=True):
        np.testing.assert_array_equal(a, b)
    assert info.positions.tolist() == [5, 5, 5]


def test_gather_all_reads_again_when_a_step_is_evicted_meanwhile(client, buffer_name,
                                                                 monkeypatch):
    buf = SequenceBuffer(client, buffer_name, 2, 8)
    _steps(buf, 2, 8)
    monkeypatch.setattr(bounds, "MAX_ITEMS_PER_COMMAND", BOUND)
    read = buf._read_steps
    calls = []

    def racing(names, *args, **kwargs):
        if not calls:  # another process adds one step per env: the oldest are evicted
            _steps(SequenceBuffer(client, buffer_name, 2, 8), 2, 1)
        calls.append(names)
        return read(names, *args, **kwargs)

    monkeypatch.setattr(buf, "_read_steps", racing)
    data, info = buf.gather_all()
    assert len(calls) == 2  # the first read found the evicted steps missing
    assert info.positions.tolist() == [1, 1]
    assert data["pos"].tolist() == [[*range(1, 8), 0]] * 2  # the new step says pos 0


def test_gather_all_with_unequal_environments_is_refused_in_parts_too(client, buffer_name,
                                                                       monkeypatch):
    from redisbuf.errors import InvalidBatchError

    buf = SequenceBuffer(client, buffer_name, 2, 8)
    _steps(buf, 2, 5)
    buf.add_batch({"pos": np.array([5]), "env": np.array([0]), "reward": np.array([0.0])},
                  env_ids=[0])
    monkeypatch.setattr(bounds, "MAX_ITEMS_PER_COMMAND", BOUND)
    with pytest.raises(InvalidBatchError, match="different numbers of steps"):
        buf.gather_all()


def test_dequeue_above_the_bound_is_refused_removing_nothing(client, buffer_name,
                                                              monkeypatch):
    buf = SequenceBuffer(client, buffer_name, 4, 10, prioritized_sampling=True)
    _steps(buf, 4, 10)
    monkeypatch.setattr(bounds, "MAX_ADD_ITEMS", 8)
    before = key_contents(client, SequenceKeys(buffer_name).all_keys())
    with pytest.raises(RequestTooLargeError, match="at most 8 steps"):
        buf.dequeue(3)  # 12 steps
    assert key_contents(client, SequenceKeys(buffer_name).all_keys()) == before
    got = buf.dequeue(4, env_ids=[1, 3])  # 8 steps: one atomic command
    assert got["pos"].tolist() == [[0, 1, 2, 3]] * 2 and got["env"][:, 0].tolist() == [1, 3]
    assert len(buf) == 32
    # the script refuses too (its own bound), whatever the client
    # the script refuses too (with its own bound, the real one), whatever the client
    monkeypatch.undo()
    keys = SequenceKeys(buffer_name).all_keys()
    before = key_contents(client, keys)
    big = bounds.MAX_ADD_ITEMS // 4 + 1
    with pytest.raises(RequestTooLargeError, match=f"at most {bounds.MAX_ADD_ITEMS} steps"):
        buf._run("seq_read", keys, ["dequeue", big, 0, 1, 2, 3])
    with pytest.raises(RequestTooLargeError, match=f"at most {bounds.MAX_ITEMS_PER_COMMAND}"):
        many = SequenceBuffer(client, f"{buffer_name}-many", bounds.MAX_ITEMS_PER_COMMAND + 1, 2)
        many._run("seq_read", many._keys, ["gather", 0])
    assert key_contents(client, keys) == before


def test_stale_removals_go_in_bounded_commands(client, buffer_name, recorder):
    from redisbuf import ReplayBuffer

    n = 2 * bounds.MAX_ADD_ITEMS + 100
    buffer = ReplayBuffer(client, buffer_name, capacity=n + 10, max_staleness=1)
    buffer.update_model_version("s", 0)
    for start, stop in bounds.chunks(n, bounds.MAX_ADD_ITEMS):
        buffer.add({"x": np.arange(start, stop, dtype=np.int64),
                    "log_rewards": np.zeros(stop - start)}, model_version=0)
    fresh = buffer.add({"x": np.arange(n, n + 10, dtype=np.int64),
                        "log_rewards": np.zeros(10)}, model_version=1).ids
    recorder.on = True
    assert buffer.update_model_version("s", 2) == n  # version 0 is stale at 2
    recorder.on = False
    assert recorder.scripts() == 3  # 1024 + 1024 + 100
    assert len(buffer) == 10 and buffer.stats()["stale_removed"] == n
    assert sorted(buffer.get(fresh)["x"].tolist()) == list(range(n, n + 10))
    assert buffer.update_model_version("s", 2) == 0


def test_stale_removals_left_follow_the_version_current_then(client, buffer_name):
    from redisbuf import ReplayBuffer

    buffer = ReplayBuffer(client, buffer_name, capacity=100, max_staleness=0)
    buffer.update_model_version("s", 0)
    for version in range(3):
        buffer.add({"x": np.full(3, version, dtype=np.int64), "log_rewards": np.zeros(3)},
                   model_version=version)
    keys = buffer.keys.all_keys()
    # another process made version 2 current and removed what was stale then
    assert buffer._run("update_model_version", keys, ["s", 2, ""]) == [6, 0]
    # a continuation ("more") goes by the current version, not the one it was started for
    assert buffer._run("update_model_version", keys, ["", 1, "more"]) == [0, 0]
    assert len(buffer) == 3
    assert client.hget(buffer.keys.meta, "cur_version") == b"2"


@pytest.mark.parametrize("saved_with_per", [False, True])
def test_load_swap_keeps_the_sums_it_no_longer_counts(client, buffer_name, tmp_path,
                                                      saved_with_per):
    """lua/restore.lua no longer iterates the items (UNLINK and RENAME per key, sums kept
    by restore_items.lua while staging): the PER sums, max and use total it writes are
    those of the restored items, whether they carry saved priorities or get the new-item
    one, over a buffer that held other items."""
    from redisbuf import PERSampler, ReplayBuffer

    n = 2500  # three staging chunks
    source = ReplayBuffer(client, f"{buffer_name}-src", capacity=n,
                          sampler=PERSampler(alpha=1.0) if saved_with_per else None, seed=0)
    for start, stop in bounds.chunks(n, bounds.MAX_ADD_ITEMS):
        source.add({"x": np.arange(start, stop, dtype=np.int64),
                    "log_rewards": np.zeros(stop - start)})
    if saved_with_per:
        ids = np.arange(1, n + 1)
        source.update_priority(ids, np.where(ids % 7 == 0, 0.0, ids / 100.0))
    for _ in range(3):
        source.sample(500)
    source.save(tmp_path / "b.rbuf")
    target = ReplayBuffer(client, buffer_name, capacity=n,
                          sampler=PERSampler(alpha=1.0, initial_priority=2.5))
    target.add({"x": np.arange(10, dtype=np.int64), "log_rewards": np.zeros(10)})
    assert target.load(tmp_path / "b.rbuf") == n
    meta = {k.decode(): v.decode() for k, v in client.hgetall(target.keys.meta).items()}
    stored = stored_priorities(client, buffer_name)  # the restored snapshot, read by the server
    per = np.array(list(stored.values()))
    uses = sum(int(v) for v in client.hvals(target.keys.uses))
    assert len(per) == n and len(target) == n
    if not saved_with_per:
        assert (per == 2.5).all()
    replica = fresh_replica(client, buffer_name, "per")  # its sums: the snapshot's own
    assert replica_scores(replica) == stored
    assert replica.score_sum == pytest.approx(per.sum(), rel=1e-12)
    assert replica.nonzero == int((per > 0).sum())
    assert float(meta["per_max"]) == per.max()
    assert int(meta["present_uses"]) == uses == 1500
    assert not [k for k in meta if k.startswith(("uses:", "per:"))]
    assert not list(client.scan_iter(match=f"rb:{{{buffer_name}}}:staging:*"))


def test_add_slices_keep_items_and_bytes_under_the_bounds():
    big, cap = bounds.MAX_ADD_BYTES, bounds.MAX_ADD_ITEMS
    assert bounds.add_slices([]) == []
    assert bounds.add_slices([10] * (cap + 1)) == [(0, cap), (cap, cap + 1)]
    assert bounds.add_slices([big // 2] * 5) == [(0, 2), (2, 4), (4, 5)]
    assert bounds.add_slices([1, big + 1, 1]) == [(0, 1), (1, 2), (2, 3)]  # alone if larger
    assert bounds.add_refusal(2, big) is None and bounds.add_refusal(1, 10 * big) is None
    assert "MAX_ADD_BYTES" in bounds.add_refusal(2, big + 1)
    assert "MAX_ADD_ITEMS" in bounds.add_refusal(cap + 1, 0)


def test_an_add_above_the_byte_bound_is_stored_in_slices_under_it(client, buffer_name,
                                                                  monkeypatch, recorder):
    from redisbuf import ReplayBuffer

    # the client's bound lowered (the scripts keep theirs: test_fcall_add_above_...)
    monkeypatch.setattr(bounds, "MAX_ADD_BYTES", 64 * 1024)
    buffer = ReplayBuffer(client, buffer_name, capacity=100)
    dim = 64 * 1024 // 4 // 2  # two items of about half the bound, plus headers
    half = {"x": np.zeros((2, dim), np.float32), "log_rewards": np.zeros(2)}
    buffer.add({"x": np.zeros((1, dim), np.float32), "log_rewards": np.zeros(1)})
    recorder.on = True
    assert buffer.add(half).ids.tolist() == [2, 3] and len(buffer) == 3  # (tests/test_large_add.py)
    recorder.on = False
    staged = [c for c in recorder.commands if c[0] == "HSET" and ":adding:" in c[1]]
    assert [len(c) for c in staged] == [4, 4]  # one item a slice: two are above the bound
    # one item alone may be larger than the byte bound; a batch at the bound is stored
    one = {"x": np.zeros((1, 2 * dim + 10), np.float32), "log_rewards": np.zeros(1)}
    other = ReplayBuffer(client, f"{buffer_name}-one", capacity=10)
    assert len(other.add(one).ids) == 1
    under = ReplayBuffer(client, f"{buffer_name}-under", capacity=10)
    fits = {"x": np.zeros((2, dim - 64), np.float32), "log_rewards": np.zeros(2)}
    assert sum(len(b) for b in under.encode(fits)[0]) <= bounds.MAX_ADD_BYTES
    assert len(under.add(fits).ids) == 2


def test_a_load_of_large_items_is_staged_in_adds_under_the_byte_bound(client, buffer_name,
                                                                      tmp_path, recorder,
                                                                      monkeypatch):
    from redisbuf import ReplayBuffer

    monkeypatch.setattr(bounds, "MAX_ADD_BYTES", 2 * 1024 * 1024)  # the client's
    dim = 1024  # 4 KiB items: 1000 of them would be 4 MiB, over that byte bound
    n = 1500
    source = ReplayBuffer(client, f"{buffer_name}-src", capacity=n)
    rows = np.arange(n, dtype=np.float32)[:, None] * np.ones(dim, np.float32)
    for start, stop in bounds.add_slices([dim * 4 + 64] * n):
        source.add({"x": rows[start:stop], "log_rewards": np.zeros(stop - start)})
    source.save(tmp_path / "big.rbuf")
    target = ReplayBuffer(client, buffer_name, capacity=n)
    recorder.on = True
    assert target.load(tmp_path / "big.rbuf") == n
    recorder.on = False
    adds = [c for c in recorder.commands if c[0] in ("EVALSHA", "FCALL") and len(c) > 40]
    assert len(adds) >= 3 and all((len(c) - 20) // 2 <= 1000 for c in adds)
    ids = [int(i) for i in client.zrange(target.keys.order, 0, -1)]
    assert target.get(ids)["x"][:, 0].tolist() == list(range(n))  # the file's order


@pytest.mark.parametrize("holes", [False, True])
def test_chunked_window_draw_without_replacement_is_a_uniform_subset(client, buffer_name,
                                                                     monkeypatch, recorder,
                                                                     holes):
    import itertools
    import math

    from test_sampling import chi2, chi2_limit

    from redisbuf import ReplayBuffer

    if holes:  # reward eviction took some low ids: the window's ranks are not ids
        buffer = ReplayBuffer(client, buffer_name, capacity=10, prioritized_capacity=True,
                              seed=1)
        rewards = [0.0, -5, 0, 0, -5, 0, 0, 0, 0, 0, -5, 0, 0]
        buffer.add({"x": np.arange(13, dtype=np.int64), "log_rewards": np.array(rewards)})
    else:
        buffer = ReplayBuffer(client, buffer_name, capacity=10, seed=1)
        buffer.add({"x": np.arange(10, dtype=np.int64), "log_rewards": np.zeros(10)})
    present = [int(m) for m in client.zrange(buffer.keys.order, 0, -1)]
    window = present[-6:]
    assert len(present) == 10 and (not holes or window[-1] - window[0] > 5)
    monkeypatch.setattr(bounds, "MAX_ITEMS_PER_COMMAND", 2)
    trials, n = 900, 4
    subsets, firsts = Counter(), Counter()
    recorder.on = True
    for _ in range(trials):
        ids = buffer.sample_with_info(n, sample_range=slice(-6, None)).ids.tolist()
        assert len(set(ids)) == n and set(ids) <= set(window)
        subsets[tuple(sorted(ids))] += 1
        firsts[ids[0]] += 1
    recorder.on = False
    cells = list(itertools.combinations(window, n))
    observed = np.array([subsets[c] for c in cells], dtype=float)
    assert chi2(observed, np.full(len(cells), trials / math.comb(6, n))) < chi2_limit(
        len(cells) - 1)
    observed = np.array([firsts[i] for i in window], dtype=float)
    assert chi2(observed, np.full(6, trials / 6)) < chi2_limit(5)
    assert int(client.hget(buffer.keys.meta, "sampled")) == trials * n  # each once
    assert not list(client.scan_iter(match=buffer.keys.drawing("*")))
    # the draws went in commands of at most the (lowered) bound: 4 = 2 + 2 at least
    windows = [c for c in recorder.commands if c[0] in ("EVALSHA", "FCALL") and c[-1] == "exclude"]
    assert len(windows) >= trials * 2 and max(int(c[-8]) for c in windows) == 2


@pytest.mark.redis_server
def test_fcall_add_above_the_byte_bound_is_refused(real_client, buffer_name):
    import redis as redis_py

    from redisbuf import ReplayBuffer
    from redisbuf.store import functions

    buffer = ReplayBuffer(real_client, buffer_name, capacity=10)
    functions.install(real_client)
    keys = buffer.keys.all_keys()
    half = b"x" * (bounds.MAX_ADD_BYTES // 2 + 1)
    args = ['{"kind":"dict","fields":{}}', 2, "", half, "0", half, "0"]
    with pytest.raises(redis_py.ResponseError, match="RB_LIMIT .*bytes"):
        real_client.execute_command("FCALL", "rb_add", len(keys), *keys, *args)
    assert len(buffer) == 0 and real_client.hlen(buffer.keys.items) == 0


def test_a_sequence_batch_above_the_bound_is_refused(client, buffer_name):
    """One lua/seq_sample.lua call draws a batch's windows: above the bound Python refuses
    it, and so does the script itself (a client that is not ours), writing nothing."""
    buf = SequenceBuffer(client, buffer_name, 2, 8)
    _steps(buf, 2, 8)
    big = bounds.MAX_WINDOWS_PER_DRAW + 1
    with pytest.raises(RequestTooLargeError, match="at most 2048 windows"):
        buf.get_batch(big, 1)
    sampled = client.hget(SequenceKeys(buffer_name).meta, "sampled")
    with pytest.raises(RequestTooLargeError, match="at most 2048 windows"):
        buf._run("seq_sample", buf._keys, [1, big, "0", 0, "0", "1", 0, "0", b"", 1])
    assert client.hget(SequenceKeys(buffer_name).meta, "sampled") == sampled
    assert buf.get_batch(bounds.MAX_WINDOWS_PER_DRAW, 1)[0]["pos"].shape == (2048, 1)
