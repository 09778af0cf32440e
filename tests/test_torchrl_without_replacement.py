"""redisbuf.torchrl: sampling without replacement, in epochs over the shared buffer's
items, one epoch per process (TorchRL's SamplerWithoutReplacement)."""

from __future__ import annotations

import uuid

import pytest

pytest.importorskip("torchrl", reason="torchrl is not importable (pip install 'redisbuf[torchrl]')")

import redis  # noqa: E402
import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torchrl.data import (  # noqa: E402
    ReplayBuffer,
    SamplerWithoutReplacement,
    TensorDictMaxValueWriter,
    TensorDictReplayBuffer,
)

from redisbuf import ReplayBuffer as CoreBuffer  # noqa: E402
from redisbuf.torchrl import (  # noqa: E402
    EmptyStorageError,
    RedisbufMaxValueWriter,
    RedisbufSamplerWithoutReplacement,
    RedisbufStorage,
)


@pytest.fixture
def name() -> str:
    return f"trl-{uuid.uuid4().hex[:8]}"


def tagged(n: int, start: int = 0) -> TensorDict:
    tag = torch.arange(start, start + n)
    return TensorDict({"tag": tag, "obs": tag[:, None].float().expand(n, 3).clone()}, [n])


def epoch(rb) -> list[list[int]]:
    """The batches of one pass of TorchRL's iteration over ``rb``."""
    batches = []
    for batch in rb:
        assert torch.equal(batch["obs"], batch["tag"][:, None].float().expand(len(batch), 3))
        batches.append(batch["tag"].tolist())
    return batches


def test_torchrls_sampler_maps_to_ours(client, name):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 20),
                                sampler=SamplerWithoutReplacement(drop_last=True,
                                                                  shuffle=False),
                                batch_size=3)
    sampler = rb.sampler
    assert isinstance(sampler, RedisbufSamplerWithoutReplacement)
    assert isinstance(sampler, SamplerWithoutReplacement)
    assert sampler.drop_last and not sampler.shuffle


def test_an_epoch_returns_every_item_once_and_then_runs_out(client, name):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 50),
                                sampler=RedisbufSamplerWithoutReplacement(), batch_size=4)
    rb.extend(tagged(10))
    first = epoch(rb)
    assert [len(b) for b in first] == [4, 4, 2]  # drop_last=False: a short last batch
    assert sorted(t for b in first for t in b) == list(range(10))
    assert rb.sampler.ran_out
    second = epoch(rb)  # a new epoch, a new order
    assert sorted(t for b in second for t in b) == list(range(10))
    orders = {tuple(t for b in epoch(rb) for t in b) for _ in range(4)}
    assert len(orders) > 1  # shuffled per epoch


def test_ran_out_and_remaining_batches_follow_the_epoch(client, name):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 50),
                                sampler=SamplerWithoutReplacement(), batch_size=3)
    rb.extend(tagged(7))
    seen = []
    for expect_left, expect_out in ((2, False), (1, False), (0, True)):
        seen += rb.sample()["tag"].tolist()
        assert rb.sampler._remaining_batches == expect_left
        assert rb.sampler.ran_out is expect_out
    assert sorted(seen) == list(range(7))
    rb.sample()  # the next epoch
    assert not rb.sampler.ran_out


def test_drop_last_gives_full_batches_only(client, name):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 50),
                                sampler=SamplerWithoutReplacement(drop_last=True),
                                batch_size=4)
    rb.extend(tagged(10))
    batches = epoch(rb)
    assert [len(b) for b in batches] == [4, 4]
    assert len(set(t for b in batches for t in b)) == 8
    small = TensorDictReplayBuffer(storage=RedisbufStorage(client, name + "s", 50),
                                   sampler=SamplerWithoutReplacement(drop_last=True),
                                   batch_size=4)
    small.extend(tagged(3))
    with pytest.raises(ValueError, match="greater than the storage capacity"):
        small.sample()


def test_shuffle_false_is_insertion_order_every_epoch(client, name):
    rb = ReplayBuffer(storage=RedisbufStorage(client, name, 50),
                      sampler=SamplerWithoutReplacement(shuffle=False), batch_size=4)
    rb.extend(torch.arange(100, 110))
    for _ in range(2):
        assert [b.tolist() for b in rb] == [[100, 101, 102, 103], [104, 105, 106, 107],
                                            [108, 109]]


def test_evicted_items_are_skipped_and_new_ones_wait_for_the_next_epoch(client, name):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 10),
                                sampler=SamplerWithoutReplacement(shuffle=False),
                                batch_size=4)
    rb.extend(tagged(10))
    assert rb.sample()["tag"].tolist() == [0, 1, 2, 3]
    rb.extend(tagged(5, start=10))  # evicts 0..4: 4 was not drawn yet
    rest = [rb.sample()["tag"].tolist() for _ in range(2)]
    assert rest == [[5, 6, 7, 8], [9]] and rb.sampler.ran_out  # 4 skipped, 10.. wait
    assert [t for b in epoch(rb) for t in b] == list(range(5, 15))


def test_an_epoch_whose_items_were_all_evicted_starts_a_new_one(client, name):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 4),
                                sampler=SamplerWithoutReplacement(shuffle=False),
                                batch_size=2)
    rb.extend(tagged(4))
    rb.sample()
    rb.extend(tagged(4, start=4))  # every item of the epoch is gone
    assert rb.sample()["tag"].tolist() == [4, 5]
    CoreBuffer.open(client, name).clear()
    with pytest.raises(EmptyStorageError, match="Cannot sample from an empty storage"):
        rb.sample()


def test_each_sampler_has_its_own_epoch(client, name):
    """Two buffers on the same items (as two processes would be): each one's epoch holds
    every item once, whatever the other draws."""
    a = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 100),
                               sampler=SamplerWithoutReplacement(), batch_size=5)
    b = TensorDictReplayBuffer(storage=RedisbufStorage(client, name),
                               sampler=SamplerWithoutReplacement(), batch_size=3)
    a.extend(tagged(20))
    seen_a, seen_b = [], []
    while not (a.sampler.ran_out and b.sampler.ran_out):
        if not a.sampler.ran_out:
            seen_a += a.sample()["tag"].tolist()
        if not b.sampler.ran_out:
            seen_b += b.sample()["tag"].tolist()
    assert sorted(seen_a) == sorted(seen_b) == list(range(20))


@pytest.mark.redis_server
def test_samplers_on_separate_connections_while_a_writer_evicts(redis_server, name):
    """A reader on its own connection never gets an item twice within an epoch, nor an
    item evicted before its read, while another connection keeps writing."""
    writer = TensorDictReplayBuffer(storage=RedisbufStorage(redis_server.url, name, 30))
    writer.extend(tagged(30))
    reader = TensorDictReplayBuffer(storage=RedisbufStorage(redis_server.url, name),
                                    sampler=SamplerWithoutReplacement(), batch_size=4)
    check = redis.Redis.from_url(redis_server.url)
    try:
        plain = CoreBuffer.open(check, name)
        start, seen = 30, []
        reader.sample()  # the epoch's snapshot: items 0..29
        epoch, seen = reader.sampler._epoch, []
        while not reader.sampler.ran_out:
            writer.extend(tagged(2, start=start))
            start += 2
            left = epoch[reader.sampler._position:].tolist()
            batch = reader.sample()
            if reader.sampler._epoch is not epoch:
                # the writer evicted all the epoch had left: a new epoch began (documented)
                assert not any(plain.records(left))
                break
            tags = batch["tag"].tolist()
            seen += tags
            assert all(t < 30 for t in tags)  # new items wait for the next epoch
            plain.get(batch["index"].tolist())  # stored when read (none evicted since)
        assert len(seen) == len(set(seen))
    finally:
        check.close()


def test_generator_state_dict_and_dumps(client, name, tmp_path):
    def make(suffix: str, seed: int):
        gen = torch.Generator().manual_seed(seed)
        rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name + suffix, 50),
                                    sampler=SamplerWithoutReplacement(), batch_size=4,
                                    generator=gen)
        rb.extend(tagged(12))
        return rb

    one, two = make("a", 7), make("b", 7)
    assert [one.sample()["tag"].tolist() for _ in range(3)] == [
        two.sample()["tag"].tolist() for _ in range(3)]
    rb = make("c", 1)
    first = rb.sample()["tag"].tolist()
    state = rb.sampler.state_dict()
    rest = [rb.sample()["tag"].tolist() for _ in range(2)]
    rb.sampler.load_state_dict(state)
    assert [rb.sample()["tag"].tolist() for _ in range(2)] == rest
    assert sorted(first + sum(rest, [])) == list(range(12))
    rb.sampler.load_state_dict(state)
    rb.sampler.dumps(tmp_path / "s")
    fresh = RedisbufSamplerWithoutReplacement()
    fresh.loads(tmp_path / "s")
    assert torch.equal(fresh._epoch, rb.sampler._epoch) and fresh._position == 4
    rb.empty()
    assert rb.sampler._epoch is None and not rb.sampler.ran_out


def test_prefetch_and_repr(client, name):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 50),
                                sampler=SamplerWithoutReplacement(), batch_size=5,
                                prefetch=3)
    rb.extend(tagged(20))
    got = [t for b in epoch(rb) for t in b]
    assert sorted(got) == list(range(20))
    assert "RedisbufSamplerWithoutReplacement" in repr(rb.sampler)


def test_torchrls_classes_given_as_factories_map_too(client, name):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 5),
                                sampler=SamplerWithoutReplacement,
                                writer=TensorDictMaxValueWriter, batch_size=2)
    assert isinstance(rb.sampler, RedisbufSamplerWithoutReplacement)
    assert isinstance(rb.writer, RedisbufMaxValueWriter)
    assert rb.writer._rank_key == ("next", "reward")
