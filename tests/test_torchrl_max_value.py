"""redisbuf.torchrl: the max-value writer keeps the max_size items of highest rank on the
server, with TorchRL's TensorDictMaxValueWriter rules."""

from __future__ import annotations

import pickle
import random
import threading
import uuid

import pytest

pytest.importorskip("torchrl", reason="torchrl is not importable (pip install 'redisbuf[torchrl]')")

import redis  # noqa: E402
import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torchrl.data import (  # noqa: E402
    LazyTensorStorage,
    ReplayBuffer,
    TensorDictMaxValueWriter,
    TensorDictReplayBuffer,
)

from redisbuf import ReplayBuffer as CoreBuffer  # noqa: E402
from redisbuf.errors import ConfigMismatchError, InvalidBatchError  # noqa: E402
from redisbuf.torchrl import (  # noqa: E402
    RedisbufMaxValueWriter,
    RedisbufStorage,
    RedisbufWriter,
)


@pytest.fixture
def name() -> str:
    return f"trl-{uuid.uuid4().hex[:8]}"


def ranked(values: list[float], start: int = 0, key: str = "score") -> TensorDict:
    """Items whose ``key`` is ``values`` and whose ``tag`` numbers them from ``start``."""
    n = len(values)
    return TensorDict({key: torch.tensor(values, dtype=torch.float32),
                       "tag": torch.arange(start, start + n)}, [n])


def stored(rb) -> list[int]:
    return sorted(rb[:]["tag"].tolist()) if len(rb) else []


def test_torchrls_writer_maps_to_ours_and_keeps_the_top(client, name):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 3),
                                writer=TensorDictMaxValueWriter(rank_key="score"))
    assert isinstance(rb.writer, RedisbufMaxValueWriter)
    assert isinstance(rb.writer, TensorDictMaxValueWriter)  # TorchRL's isinstance checks
    assert rb.writer._rank_key == "score" and rb.writer._reduction == "sum"
    index = rb.extend(ranked([5, 1, 7, 3, 9]))
    # 5, 1, 7 fill it; 3 replaces 1, 9 replaces 3: items 1 and 3 are not kept
    assert stored(rb) == [0, 2, 4]
    assert (index[[1, 3]] == -1).all() and (index[[0, 2, 4]] >= 0).all()
    kept = rb.storage[index[[0, 2, 4]]]
    assert kept["tag"].tolist() == [0, 2, 4]
    assert kept["log_rewards"].tolist() == [5.0, 7.0, 9.0]  # the rank, as log-reward


def test_when_full_a_rank_not_above_the_lowest_is_not_stored(client, name):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 2),
                                writer=RedisbufMaxValueWriter(rank_key="score"))
    rb.extend(ranked([4, 6]))
    tie = rb.extend(ranked([4], start=10))   # equal to the lowest: refused, as TorchRL
    low = rb.extend(ranked([1], start=11))
    assert tie.tolist() == [-1] and low.tolist() == [-1]
    assert stored(rb) == [0, 1]
    assert rb.add(TensorDict({"score": torch.tensor(0.5), "tag": torch.tensor(12)}, [])) is None
    new = rb.add(TensorDict({"score": torch.tensor(5.0), "tag": torch.tensor(13)}, []))
    assert isinstance(new, int) and new > 0
    assert stored(rb) == [1, 13]
    assert int(rb[new]["tag"]) == 13


def test_default_rank_key_and_reductions_over_trailing_dims(client, name):
    rewards = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 5.0], [2.0, 2.0, -9.0]])
    data = TensorDict({"next": {"reward": rewards}, "tag": torch.arange(3)}, [3])
    expect = {"sum": [3.0, 5.0, -5.0], "max": [1.0, 5.0, 2.0], "min": [1.0, 0.0, -9.0],
              "mean": [1.0, 5 / 3, -5 / 3], "median": [1.0, 0.0, 2.0]}
    for reduction, ranks in expect.items():
        rb = TensorDictReplayBuffer(
            storage=RedisbufStorage(client, f"{name}-{reduction}", 10),
            writer=TensorDictMaxValueWriter(reduction=reduction))
        index = rb.extend(data.clone())
        got = rb.storage[index]["log_rewards"].tolist()
        assert got == pytest.approx(ranks), reduction
    with pytest.raises(ValueError, match="reduction"):
        RedisbufMaxValueWriter(reduction="prod")


def test_refusals_name_the_problem_and_write_nothing(client, name):
    rb = ReplayBuffer(storage=RedisbufStorage(client, name, 5),
                      writer=TensorDictMaxValueWriter(rank_key="score"))
    with pytest.raises(RuntimeError, match="expects data to be a tensor collection"):
        rb.extend(torch.zeros(3))
    with pytest.raises(KeyError, match="Rank key"):
        rb.extend(TensorDict({"other": torch.zeros(2)}, [2]))
    with pytest.raises(InvalidBatchError, match="NaN"):
        rb.extend(ranked([1.0, float("nan")]))
    clash = ranked([1.0, 2.0]).set("log_rewards", torch.zeros(2))
    with pytest.raises(InvalidBatchError, match="log_rewards"):
        rb.extend(clash)
    assert len(rb) == 0


def test_rank_by_log_rewards_itself(client, name):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 2),
                                writer=RedisbufMaxValueWriter(rank_key="log_rewards"))
    data = TensorDict({"log_rewards": torch.tensor([3.0, 1.0, 2.0], dtype=torch.float64),
                       "tag": torch.arange(3)}, [3])
    rb.extend(data)
    assert stored(rb) == [0, 2]


@pytest.mark.parametrize("seed", range(6))
def test_same_ranks_kept_as_torchrls_writer(client, name, seed):
    """TorchRL's own writer on a LazyTensorStorage as the oracle: the same ranks stay,
    and with distinct ranks the same items of each batch are refused."""
    rng = random.Random(seed)
    capacity = rng.choice([1, 3, 7])
    ours = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, capacity),
                                  writer=RedisbufMaxValueWriter(rank_key="score"))
    theirs = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity),
                                    writer=TensorDictMaxValueWriter(rank_key="score"))
    distinct = seed % 2 == 0
    pool = rng.sample(range(1000), 200) if distinct else None
    tag = 0
    for _ in range(8):
        n = rng.randint(1, 9)
        values = [pool.pop() for _ in range(n)] if pool else [rng.randint(0, 5) for _ in range(n)]
        got = ours.extend(ranked(values, start=tag))
        want = theirs.extend(ranked(values, start=tag))
        tag += n
        if distinct:
            assert (got >= 0).tolist() == (want >= 0).tolist()
        assert len(ours) == len(theirs)
        assert sorted(ours[:]["score"].tolist()) == sorted(theirs[:]["score"].tolist())


def test_a_fresh_default_storage_is_switched_to_rank_eviction(client, name):
    storage = RedisbufStorage(client, name, 4)
    assert not storage.buffer.prioritized_capacity
    TensorDictReplayBuffer(storage=storage, writer=TensorDictMaxValueWriter(rank_key="score"))
    assert storage.buffer.prioritized_capacity
    assert CoreBuffer.open(client, name).prioritized_capacity  # every process sees it
    assert RedisbufStorage(client, name).buffer.prioritized_capacity
    with pytest.raises(ConfigMismatchError):  # a FIFO opening of it is refused now
        CoreBuffer(client, name, capacity=4)


def test_storages_that_cannot_evict_by_rank_are_refused(client, name):
    written = RedisbufStorage(client, name, 4)
    TensorDictReplayBuffer(storage=written).extend(ranked([1.0]))
    with pytest.raises(ConfigMismatchError, match="prioritized_capacity=True"):
        TensorDictReplayBuffer(storage=written, writer=TensorDictMaxValueWriter())
    asked = RedisbufStorage(client, name + "f", 4, prioritized_capacity=False)
    with pytest.raises(ConfigMismatchError, match="prioritized_capacity=True"):
        TensorDictReplayBuffer(storage=asked, writer=RedisbufMaxValueWriter())
    with pytest.raises(TypeError, match="RedisbufStorage"):
        RedisbufMaxValueWriter().register_storage(LazyTensorStorage(3))
    # a RedisbufWriter beside lowest-rank eviction: the server still keeps the top
    prio = RedisbufStorage(client, name + "p", 2, prioritized_capacity=True)
    rb = TensorDictReplayBuffer(storage=prio, writer=RedisbufWriter())
    rb.extend(TensorDict({"log_rewards": torch.tensor([5.0, 1.0, 3.0]),
                          "tag": torch.arange(3)}, [3]))
    assert stored(rb) == [0, 2]


def test_writer_state_pickling_and_counts(client, name, tmp_path):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 2),
                                writer=TensorDictMaxValueWriter(rank_key="score"))
    rb.extend(ranked([1.0, 2.0, 3.0]))
    assert rb.writer._write_count == 2  # items refused by the rule are never sent
    assert "rank_key=score" in repr(rb.writer)
    assert rb.writer.state_dict() == {}
    rb.empty()
    assert len(rb) == 0 and rb.writer._write_count == 0


@pytest.mark.redis_server
def test_a_pickled_buffer_keeps_ranking_the_same_buffer(redis_server, name):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(redis_server.url, name, 2),
                                writer=TensorDictMaxValueWriter(rank_key="score",
                                                                reduction="max"))
    rb.extend(ranked([1.0, 5.0]))
    copy = pickle.loads(pickle.dumps(rb))
    assert isinstance(copy.writer, RedisbufMaxValueWriter) and copy.writer._reduction == "max"
    assert copy.storage.buffer.prioritized_capacity
    copy.extend(ranked([3.0], start=7))
    assert stored(rb) == [1, 7]


@pytest.mark.redis_server
def test_writers_on_separate_connections_share_one_top(redis_server, name):
    """Several writers, each on its own connection (as separate processes are), write
    at once: the buffer ends with the highest ranks of everything written."""
    capacity, per_writer, writers = 10, 60, 4
    everything: list[list[float]] = []
    errors: list[BaseException] = []

    def write(k: int) -> None:
        try:
            rb = TensorDictReplayBuffer(
                storage=RedisbufStorage(redis_server.url, name, capacity,
                                        prioritized_capacity=True),
                writer=RedisbufMaxValueWriter(rank_key="score"))
            values = [float(v * writers + k) for v in random.Random(k).sample(range(500),
                                                                                 per_writer)]
            everything.append(values)
            for start in range(0, per_writer, 6):
                index = rb.extend(ranked(values[start : start + 6], start=1000 * k + start))
                kept = index[index >= 0]
                if len(kept):  # what extend says it stored was stored (maybe evicted since)
                    assert (kept > 0).all()
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    threads = [threading.Thread(target=write, args=(k,)) for k in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    client = redis.Redis.from_url(redis_server.url)
    try:
        reader = TensorDictReplayBuffer(storage=RedisbufStorage(client, name))
        want = sorted(v for values in everything for v in values)[-capacity:]
        assert sorted(reader[:]["score"].tolist()) == want
    finally:
        client.close()
