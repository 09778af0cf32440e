"""redisbuf.torchrl: TorchRL's replay buffers on a shared redisbuf buffer (torchrl 0.14.1)."""

from __future__ import annotations

import functools
import pickle
import uuid

import pytest
from process_helpers import fresh_context

pytest.importorskip("torchrl", reason="torchrl is not importable (pip install 'redisbuf[torchrl]')")

import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torchrl.data import (  # noqa: E402
    RandomSampler,
    ReplayBuffer,
    RoundRobinWriter,
    SliceSampler,
    TensorDictReplayBuffer,
)

from redisbuf.errors import InvalidBatchError  # noqa: E402
from redisbuf.torchrl import (  # noqa: E402
    RedisbufPrioritizedSampler,
    RedisbufStorage,
    RedisbufWriter,
    TensorDictPrioritizedReplayBuffer,
)


def frames(n: int, start: int = 0) -> TensorDict:
    """n items; ``a`` numbers them from ``start`` and the other entries derive from it."""
    a = torch.arange(start, start + n)
    return TensorDict(
        {
            "a": a,
            "obs": a[:, None].float().expand(n, 4).clone(),
            "done": (a % 2 == 0)[:, None],
            "next": {"obs": a[:, None].to(torch.float64) + 0.5,
                     "reward": a.to(torch.bfloat16)},
            "small": a.to(torch.int8),
            "half": a.to(torch.float16),
        },
        [n],
    )


def check_items(batch: TensorDict) -> None:
    """Every entry of every item matches its ``a`` (items are whole and not mixed)."""
    a = batch["a"]
    assert torch.equal(batch["obs"], a[:, None].float().expand(len(a), 4))
    assert torch.equal(batch["done"], (a % 2 == 0)[:, None])
    assert torch.equal(batch["next", "obs"], a[:, None].to(torch.float64) + 0.5)
    assert batch["next", "reward"].dtype == torch.bfloat16
    assert torch.equal(batch["next", "reward"], a.to(torch.bfloat16))
    assert torch.equal(batch["small"], a.to(torch.int8))
    assert batch["half"].dtype == torch.float16 and torch.equal(batch["half"], a.to(torch.float16))


@pytest.fixture
def name() -> str:
    return f"trl-{uuid.uuid4().hex[:8]}"


def test_extend_returns_ids_and_storage_reads_them_back(client, name):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 100), batch_size=16)
    assert isinstance(rb.writer, RedisbufWriter)
    index = rb.extend(frames(10))
    assert index.dtype == torch.int64 and len(set(index.tolist())) == 10
    assert len(rb) == 10
    more = rb.extend(frames(5, start=10))
    assert min(more.tolist()) > max(index.tolist())  # the server's counter is the cursor
    items = rb.storage[index[[3, 0, 3]]]
    assert items["a"].tolist() == [3, 0, 3]
    check_items(items)
    one = rb[index[7]]
    assert one.batch_size == torch.Size([]) and int(one["a"]) == 7


def test_sample_gives_whole_items_and_their_index(client, name):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 100), batch_size=64)
    index = rb.extend(frames(20))
    id_of = dict(zip(range(20), index.tolist(), strict=True))
    batch = rb.sample()
    assert batch.batch_size == torch.Size([64])
    check_items(batch)
    assert [id_of[a] for a in batch["a"].tolist()] == batch["index"].tolist()


def test_eviction_is_the_servers_oldest_first(client, name):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 5), batch_size=200)
    old = rb.extend(frames(4))
    rb.extend(frames(4, start=4))
    assert len(rb) == 5
    assert set(rb.sample()["a"].tolist()) <= {3, 4, 5, 6, 7}
    with pytest.raises(KeyError):
        rb.storage[old[:2]]
    assert not rb.storage.contains(int(old[0])) and rb.storage.contains(int(old[3]))


def test_a_second_handle_sees_the_same_items(client, name):
    first = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 50), batch_size=8)
    first.extend(frames(6))
    second = TensorDictReplayBuffer(storage=RedisbufStorage(client, name), batch_size=300)
    assert len(second) == 6 and second.storage.max_size == 50
    assert set(second.sample()["a"].tolist()) == set(range(6))
    second.empty()
    assert len(first) == 0


def test_plain_tensors_random_sampler_and_add(client, name):
    rb = ReplayBuffer(storage=RedisbufStorage(client, name, 100), sampler=RandomSampler(),
                      batch_size=32)
    index = rb.extend(torch.arange(10) * 3)
    assert len(index) == 10
    out, info = rb.sample(return_info=True)
    assert out.shape == (32,) and set(out.tolist()) <= {3 * i for i in range(10)}
    assert torch.equal(rb.storage[info["index"]], out)
    tdrb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name + "b", 10), batch_size=4)
    i = tdrb.add(TensorDict({"x": torch.tensor(5.0)}, []))
    assert isinstance(i, int) and float(tdrb[i]["x"]) == 5.0


def test_transforms_and_prefetch(client, name):
    rb = TensorDictReplayBuffer(
        storage=RedisbufStorage(client, name, 100), batch_size=16, prefetch=2,
        transform=lambda td: td.set("double", td["a"] * 2),
    )
    rb.extend(frames(30))
    for _ in range(5):
        batch = rb.sample()
        check_items(batch)
        assert torch.equal(batch["double"], batch["a"] * 2)


def test_refuses_slot_writers_and_position_samplers(client, name):
    with pytest.raises(TypeError, match="process"):
        ReplayBuffer(storage=RedisbufStorage(client, name, 10), writer=RoundRobinWriter())
    with pytest.raises(TypeError, match="positions"):
        ReplayBuffer(storage=RedisbufStorage(client, name, 10),
                     sampler=SliceSampler(num_slices=2))


def test_bad_data_is_refused_and_nothing_is_written(client, name):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 10), batch_size=4)
    with pytest.raises(InvalidBatchError, match="contains"):
        rb.extend(TensorDict({"a.b": torch.zeros(3)}, [3]))
    with pytest.raises(InvalidBatchError, match="batch size"):
        rb.extend(TensorDict({"a": torch.zeros(3, 2)}, [3, 2]))
    assert len(rb) == 0


def test_state_dict_and_dumps_loads_round_trip(client, name, tmp_path):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 100), batch_size=8)
    rb.extend(frames(12))
    state = rb.state_dict()
    rb.dumps(tmp_path / "rb")
    rb.empty()
    assert len(rb) == 0
    rb.load_state_dict(state)
    assert len(rb) == 12
    # draws with replacement: one sample of 100 misses one of the 12 with probability
    # 12 (11/12)^100 ~ 0.2%, ten of them ~ 1e-36
    seen = torch.cat([rb.sample(100)["a"] for _ in range(10)])
    assert sorted(seen.unique().tolist()) == list(range(12))
    other = TensorDictReplayBuffer(storage=RedisbufStorage(client, name + "c", 100), batch_size=8)
    other.loads(tmp_path / "rb")
    check_items(other.sample(50))
    assert len(other) == 12


def per_buffer(client, name, **kwargs):
    return TensorDictPrioritizedReplayBuffer(
        alpha=0.7, beta=0.5, storage=RedisbufStorage(client, name, 1000, seed=1), **kwargs
    )


def test_prioritized_sample_weights_and_update(client, name):
    rb = per_buffer(client, name, batch_size=256)
    index = rb.extend(frames(100))
    batch = rb.sample()
    assert torch.equal(batch["priority_weight"], torch.ones(256))  # all at the same priority
    target = int(index[42])
    td = rb.sample()
    td["td_error"] = torch.where(td["index"] == target, 1e6, 1.0)
    if not bool((td["index"] == target).any()):  # make sure the target is in the batch
        td["index"][0], td["td_error"][0] = target, 1e6
    rb.update_tensordict_priority(td)
    hits = int((rb.sample()["index"] == target).sum())
    # p(target) = 1e6^0.7 / (1e6^0.7 + 99) ~ 0.994: 200 of 256 fails with prob < 1e-100
    assert hits >= 200
    weights = rb.sample()
    others = weights["priority_weight"][weights["index"] != target]
    assert torch.allclose(others, torch.ones_like(others))  # the lowest masses
    hit = weights["priority_weight"][weights["index"] == target]
    mass_ratio = ((1e6 + 1e-8) / (1 + 1e-8)) ** 0.7
    assert torch.allclose(hit, torch.full_like(hit, mass_ratio ** -0.5), rtol=1e-4)


def test_extend_with_priority_key_sets_priorities(client, name):
    rb = per_buffer(client, name, batch_size=256)
    data = frames(50)
    data["td_error"] = torch.where(data["a"] == 7, 1e6, 1.0)
    rb.extend(data)
    assert int((rb.sample()["a"] == 7).sum()) >= 200


def test_opening_never_changes_stored_priorities(client, name):
    rb = per_buffer(client, name, batch_size=8)
    index = rb.extend(frames(20))
    rb.update_priority(index, torch.arange(20, dtype=torch.float64) * 3 + 1)
    before = rb.storage.buffer.state_dict()["per_priorities"]
    again = per_buffer(client, name, batch_size=8)  # TorchRL resets 0..len-1 at construction
    again.add(TensorDict({k: v[0] for k, v in frames(1, start=99).items(include_nested=True,
                                                                          leaves_only=True)}, []))
    after = rb.storage.buffer.state_dict()["per_priorities"]
    assert list(after[:20]) == list(before) and after[20] == max(before)


def test_update_priority_skips_evicted_and_negative_ids(client, name):
    rb = TensorDictPrioritizedReplayBuffer(
        alpha=1.0, beta=1.0, storage=RedisbufStorage(client, name, 3), batch_size=4)
    old = rb.extend(frames(3))
    new = rb.extend(frames(2, start=3))
    rb.update_priority(torch.cat([old, torch.tensor([-1])]), torch.tensor([5.0, 5, 5, 5]))
    priorities = rb.storage.buffer.state_dict()["per_priorities"]
    assert list(priorities) == [5.0, 1.0, 1.0]  # only old[2] is still stored
    with pytest.raises(InvalidBatchError):
        rb.update_priority(new, torch.tensor([-1.0, 2.0]))


def test_sampler_refuses_alpha_change_and_keeps_beta(client, name):
    sampler = RedisbufPrioritizedSampler(None, 0.6, 0.4)
    with pytest.raises(ValueError, match="alpha"):
        sampler.alpha = 0.5
    sampler.beta = 0.9
    assert sampler.state_dict()["beta"] == 0.9


@pytest.mark.redis_server
def test_storage_pickles_by_url(redis_server, name):
    storage = RedisbufStorage(redis_server.url, name, 20)
    storage.buffer.add({"a": torch.arange(3)})
    clone = pickle.loads(pickle.dumps(storage))
    assert len(clone) == 3 and clone.max_size == 20


@pytest.mark.redis_server
@pytest.mark.multiprocess
def test_two_spawned_processes_share_items_and_priorities(redis_server, name):
    from torchrl_helpers import shared_buffer_worker

    ctx = fresh_context()
    barrier = ctx.Barrier(2)
    results = ctx.Queue()
    commands = [ctx.Queue(), ctx.Queue()]
    procs = [ctx.Process(target=shared_buffer_worker,
                         args=(redis_server.url, name, src, 50, barrier, commands[src], results))
             for src in (0, 1)]
    for proc in procs:
        proc.start()

    def ask(src: int, command) -> dict:
        commands[src].put(command)
        reply = results.get(timeout=120)
        assert "error" not in reply, reply["error"]
        assert reply["src"] == src
        return reply

    try:
        seen = {src: ask(src, "seen")["seen"] for src in (0, 1)}
        # 2560 uniform draws over 100 items: one is missed with probability < 1e-9
        for src in (0, 1):
            assert {(1 - src, v) for v in range(50)} <= set(seen[src])
        target = seen[0][(1, 7)]  # an item of process 1, by the id process 0 drew it under
        assert seen[1][(1, 7)] == target
        before = ask(1, ("count", target))["hits"]
        ask(0, ("boost", target))
        after = ask(1, ("count", target))["hits"]
        # before: p = 1/100, after: p ~ 0.994 (alpha 0.7); each bound fails with p < 1e-40
        assert before <= 30 and after >= 200
    finally:
        for src in (0, 1):
            commands[src].put("stop")
        for proc in procs:
            proc.join(timeout=60)
    assert [proc.exitcode for proc in procs] == [0, 0]


def test_slices_and_keys_read_in_insertion_order(client, name):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 4), batch_size=2)
    rb.extend(frames(6))
    assert rb[:]["a"].tolist() == [2, 3, 4, 5]
    assert rb[1:3]["a"].tolist() == [3, 4]
    assert rb["a"].tolist() == [2, 3, 4, 5]


def test_a_position_sampler_given_as_a_factory_is_refused_at_sampling(client, name):
    rb = ReplayBuffer(storage=RedisbufStorage(client, name, 10),
                      sampler=functools.partial(SliceSampler, num_slices=2), batch_size=2)
    rb.extend(torch.arange(4))
    with pytest.raises(TypeError, match="positions"):
        rb.sample()


@pytest.mark.redis_server
def test_a_pickled_prioritized_buffer_reopens_the_same_buffer(redis_server, name):
    rb = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5,
                                           storage=RedisbufStorage(redis_server.url, name, 100),
                                           batch_size=256)
    rb.extend(frames(10))
    clone = pickle.loads(pickle.dumps(rb))  # what a spawned process receives
    assert len(clone) == 10
    index = clone.extend(frames(3, start=10))
    assert len(rb) == 13
    clone.update_priority(index, torch.tensor([1e6, 1.0, 1.0]))
    assert int((rb.sample()["index"] == index[0]).sum()) >= 200


def test_prioritized_dumps_loads_keeps_priorities(client, name, tmp_path):
    rb = per_buffer(client, name, batch_size=256)
    rb.extend(frames(41))
    last = rb.extend(frames(1, start=41))
    rb.update_priority(last, torch.tensor([1e6]))
    rb.dumps(tmp_path / "per")
    rb.empty()
    assert len(rb) == 0
    rb.loads(tmp_path / "per")
    assert len(rb) == 42
    assert int((rb.sample()["a"] == 41).sum()) >= 200  # the priority came back with the item


def test_iterating_the_storage_yields_the_stored_items_oldest_first(client, name):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 4), batch_size=2)
    assert list(rb.storage) == []
    rb.extend(frames(6))  # 0 and 1 are evicted
    seen = list(rb.storage)
    assert [int(item["a"]) for item in seen] == [2, 3, 4, 5]
    assert all(item.batch_size == torch.Size([]) for item in seen)
    check_items(torch.stack(seen))
    plain = ReplayBuffer(storage=RedisbufStorage(client, name + "t", 10))
    plain.extend(torch.arange(3) * 10)
    assert [int(x) for x in plain.storage] == [0, 10, 20]
