"""ShardedReplayBuffer on fakeredis: layout, aggregation, refusals, and draws that
reproduce the unsharded distribution (chi-square). The same checks run on a real
3-master cluster in test_cluster.py."""

from __future__ import annotations

import numpy as np
import pytest
import redis.crc
from cluster_helpers import (
    ITEMS,
    check_prioritized_pairs,
    check_prioritized_with_replacement,
    check_uniform_subsets,
    chi2_limit,
    filled,
    items,
)

from redisbuf import ReplayBuffer
from redisbuf.buffers.sharded import ShardedReplayBuffer
from redisbuf.errors import (
    ConfigMismatchError,
    EmptyBufferError,
    SamplingError,
    SchemaError,
    ShardedBufferError,
    ShardUnavailableError,
)
from redisbuf.store import scripts
from redisbuf.store.keys import BufferKeys


def test_shards_get_their_own_hash_tags_in_separate_slot_ranges(fake_client, buffer_name):
    buffer = ShardedReplayBuffer(fake_client, buffer_name, capacity=100, shards=4)
    assert isinstance(buffer, ShardedReplayBuffer)
    assert len(set(buffer.shard_names)) == 4
    for k, shard in enumerate(buffer.shards):
        assert shard.name == buffer.shard_names[k] and shard.name.startswith(buffer_name)
        slots = {redis.crc.key_slot(key.encode()) for key in shard.keys.all_keys()}
        assert len(slots) == 1  # one slot per shard: its scripts stay atomic there
        assert k * 16384 // 4 <= slots.pop() < (k + 1) * 16384 // 4
    assert [shard.capacity for shard in buffer.shards] == [25, 25, 25, 25]


def test_capacity_is_split_and_each_shard_evicts_its_oldest(fake_client, buffer_name):
    buffer = ShardedReplayBuffer(fake_client, buffer_name, capacity=10, shards=3, seed=1)
    assert [shard.capacity for shard in buffer.shards] == [4, 3, 3]
    for start in range(0, 60, 5):
        buffer.add(items(np.arange(start, start + 5)))
    assert len(buffer) == 10
    kept = sorted(buffer.get([i for s in buffer.shards for i in _global_ids(buffer, s)])["v"])
    # every shard got 4 batches of 5 and kept its newest items
    assert kept[-1] == 59 and min(kept) >= 40
    stats = buffer.stats()
    assert (stats["capacity"], stats["length"], stats["inserted"]) == (10, 10, 60)
    assert stats["evicted"] == 50 and len(stats["shards"]) == 3


def _global_ids(buffer, shard):
    k = buffer.shards.index(shard)
    members = shard.client.zrange(shard.keys.order, 0, -1)
    return [int(m) * buffer.count + k for m in members]


def test_adds_take_the_shards_in_turn_with_global_ids(fake_client, buffer_name):
    buffer = ShardedReplayBuffer(fake_client, buffer_name, capacity=30, shards=3, seed=2)
    results = [buffer.add(items([10 * b, 10 * b + 1], [b, b])) for b in range(6)]
    targets = [int(r.ids[0]) % 3 for r in results]
    assert sorted(targets[:3]) == [0, 1, 2] and targets[3:] == targets[:3]
    assert [len(s) for s in buffer.shards] == [4, 4, 4]
    assert len(buffer) == 12
    ids = np.concatenate([r.ids for r in results])
    assert len(set(ids.tolist())) == 12
    np.testing.assert_array_equal(
        buffer.get(ids[::-1])["v"], [v for b in reversed(range(6)) for v in (10 * b + 1, 10 * b)]
    )
    top = buffer.top(3)
    assert [score for _id, score in top] == [5.0, 5.0, 4.0]
    assert {i for i, _score in top[:2]} == set(results[5].ids.tolist())
    with pytest.raises(KeyError, match="ids not in buffer"):
        buffer.get([int(ids.max()) + 3])


def test_top_merges_the_shards(fake_client, buffer_name):
    buffer = ShardedReplayBuffer(fake_client, buffer_name, capacity=30, shards=3, seed=4)
    for b in range(3):
        buffer.add(items([b, b + 10], [b, b + 10]))
    top = buffer.top(4)
    assert [score for _id, score in top] == [12.0, 11.0, 10.0, 2.0]
    assert buffer.get([i for i, _score in top])["v"].tolist() == [12, 11, 10, 2]


def test_reopening_checks_the_layout(fake_client, buffer_name):
    ShardedReplayBuffer(fake_client, buffer_name, capacity=30, shards=3)
    with pytest.raises(ConfigMismatchError, match="shards 3, not 2"):
        ShardedReplayBuffer(fake_client, buffer_name, capacity=30, shards=2)
    with pytest.raises(ConfigMismatchError, match="capacity 30, not 40"):
        ShardedReplayBuffer(fake_client, buffer_name, capacity=40, shards=3)
    again = ShardedReplayBuffer.open(fake_client, buffer_name)
    assert (again.count, again.capacity) == (3, 30)
    with pytest.raises(ShardedBufferError, match="is sharded"):
        ReplayBuffer.open(fake_client, buffer_name)
    ReplayBuffer(fake_client, "plain", capacity=5)
    with pytest.raises(ConfigMismatchError, match="exists unsharded"):
        ShardedReplayBuffer(fake_client, "plain", capacity=5, shards=2)


def test_opening_a_sharded_name_without_shards_is_refused_and_writes_nothing(
    client, buffer_name
):
    # issue 24: ReplayBuffer(..., shards=1) made an empty plain buffer beside the layout, and
    # from then on every sharded open was refused
    sharded = ShardedReplayBuffer(client, buffer_name, capacity=90, shards=3)
    sharded.add(items([1, 2]))
    before = sorted(client.keys("*"))
    for capacity in (90, None):
        with pytest.raises(ConfigMismatchError, match=r"is sharded \(3 shards\), not 1"):
            ReplayBuffer(client, buffer_name, capacity=capacity)
    assert sorted(client.keys("*")) == before
    assert len(ShardedReplayBuffer.open(client, buffer_name)) == 2
    assert len(ShardedReplayBuffer(client, buffer_name, capacity=90, shards=3)) == 2
    # a name left with both by an earlier version: the stray plain buffer opens and drops
    # alone (its drop leaves the layout), and the sharded buffer opens again
    keys = BufferKeys(buffer_name)
    stray = f"rb:{{{buffer_name}}}:none"  # the old init.lua knew no layout key
    scripts.load("init")(client, [keys.meta, stray], [90, "fifo", 1, 0, "600.0"])
    with pytest.raises(ConfigMismatchError, match="exists unsharded"):
        ShardedReplayBuffer.open(client, buffer_name)
    ReplayBuffer.open(client, buffer_name).drop()
    assert sorted(client.keys("*")) == before
    assert len(ShardedReplayBuffer.open(client, buffer_name)) == 2


def test_the_scripts_refuse_a_plain_buffer_beside_a_layout_and_the_reverse(
    client, buffer_name
):
    # the rule holds on the server, for a process that skips every check of the client
    keys = BufferKeys(buffer_name)
    ShardedReplayBuffer(client, buffer_name, capacity=9, shards=3)
    with pytest.raises(ConfigMismatchError):
        scripts.load("init")(client, [keys.meta, keys.shards], [9, "fifo", 1, 0, "600.0"])
    assert not client.exists(keys.meta)
    plain = BufferKeys(buffer_name + "-plain")
    ReplayBuffer(client, plain.name, capacity=9)
    with pytest.raises(ConfigMismatchError):
        scripts.load("shard_layout")(client, [plain.shards, plain.meta], ['{"shards": 3}'])
    with pytest.raises(ConfigMismatchError, match="exists unsharded"):
        ShardedReplayBuffer(client, plain.name, capacity=9, shards=3)
    assert not client.exists(plain.shards)


class _FailingShard:
    """``client`` whose pipelines answer every command about shard ``name`` with
    ``error`` (a reply, as a cluster pipeline gives CLUSTERDOWN) or, with ``raising``,
    raise it from the whole pipeline the first time."""

    def __init__(self, client, name, error, raising=False):
        self.inner, self.tag, self.error, self.raising = client, f"{{{name}}}", error, raising

    def __getattr__(self, attribute):
        return getattr(self.inner, attribute)

    def pipeline(self, *args, **kwargs):
        outer = self
        pipe = self.inner.pipeline(*args, **kwargs)

        class Pipe:
            def __getattr__(self, attribute):
                return getattr(pipe, attribute)

            def execute(self, raise_on_error=True):
                stack = pipe.unwrapped.command_stack
                hit = [
                    any(outer.tag in (a.decode() if isinstance(a, bytes) else str(a)) for a in args)
                    for args, _options in stack
                ]
                if outer.raising and len(stack) > 1:
                    raise outer.error
                replies = pipe.execute(raise_on_error=False)
                return [outer.error if h else r for h, r in zip(hit, replies, strict=True)]

        return Pipe()


@pytest.mark.parametrize("raising", [False, True])
@pytest.mark.parametrize(
    "error",
    [
        redis.exceptions.ClusterDownError("The cluster is down"),
        redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot"),
        redis.exceptions.MasterDownError("Link with MASTER is down"),
    ],
)
@pytest.mark.parametrize("prioritized", [False, True])
def test_cluster_errors_of_one_shard_are_shard_unavailable_naming_it(
    fake_client, buffer_name, error, raising, prioritized
):
    # issue 24: while a restarted master rejoined, _sizes raised a bare ClusterDownError
    buffer = ShardedReplayBuffer(
        fake_client, buffer_name, capacity=30, shards=3, prioritized_sampling=prioritized
    )
    for b in range(3):
        buffer.add(items([b], [0.0]))
    buffer.client = _FailingShard(buffer.client, buffer.shard_names[1], error, raising)
    for call in (lambda: len(buffer), lambda: buffer.sample(2)):
        with pytest.raises(ShardUnavailableError, match=r"shard 1 of 3 \(") as caught:
            call()
        assert caught.value.shard == 1


def test_a_cluster_error_in_a_shard_draw_is_shard_unavailable(fake_client, buffer_name):
    buffer = ShardedReplayBuffer(fake_client, buffer_name, capacity=30, shards=3)
    for b in range(3):
        buffer.add(items([b]))

    def rejoining(*args, **kwargs):
        raise redis.exceptions.TryAgainError("slot is being migrated")

    buffer.shards[2]._draw = rejoining
    with pytest.raises(ShardUnavailableError, match="shard 2 of 3") as caught:
        buffer.sample(3)
    assert caught.value.shard == 2


def test_refusals_name_the_problem(fake_client, buffer_name):
    with pytest.raises(ValueError, match="does not support max_use"):
        ShardedReplayBuffer(fake_client, buffer_name, capacity=30, shards=3, max_use=2)
    with pytest.raises(ValueError, match="shards must be a positive integer"):
        ShardedReplayBuffer(fake_client, buffer_name, capacity=30, shards=0)
    with pytest.raises(ValueError, match="capacity must be an integer >= shards"):
        ShardedReplayBuffer(fake_client, buffer_name, capacity=2, shards=3)
    buffer = ShardedReplayBuffer(fake_client, buffer_name, capacity=30, shards=3)
    with pytest.raises(EmptyBufferError, match="empty"):
        buffer.sample(1)
    # a sharded buffer is made explicitly: ReplayBuffer has no shards argument
    with pytest.raises(TypeError, match="shards"):
        ReplayBuffer(fake_client, buffer_name + "-plain", capacity=30, shards=3)
    assert not fake_client.exists(BufferKeys(buffer_name + "-plain").meta)


def test_a_batch_of_another_schema_is_refused_whatever_shard_it_would_go_to(
    fake_client, buffer_name
):
    buffer = ShardedReplayBuffer(fake_client, buffer_name, capacity=30, shards=3)
    buffer.add(items([1, 2]))
    other = ShardedReplayBuffer(fake_client, buffer_name, capacity=30, shards=3)
    for _ in range(3):  # every shard in turn, two of them still empty
        with pytest.raises(SchemaError, match="does not fit sharded buffer"):
            other.add({"w": np.arange(2.0), "log_rewards": np.zeros(2)})
    assert len(other) == 2 and [len(s) for s in other.shards].count(0) == 2


def test_clear_and_drop_cover_every_shard(fake_client, buffer_name):
    buffer = ShardedReplayBuffer(fake_client, buffer_name, capacity=30, shards=3)
    for b in range(3):
        buffer.add(items([b]))
    assert buffer.clear() == 3 and len(buffer) == 0
    buffer.drop()
    assert fake_client.keys("*") == []
    assert not fake_client.exists(BufferKeys(buffer_name).shards)


def test_uniform_draws_make_every_subset_equally_likely(fake_client, buffer_name):
    check_uniform_subsets(filled(fake_client, buffer_name, prioritized=False), 300)


def test_uniform_draws_with_replacement_are_independent(fake_client, buffer_name):
    buffer = filled(fake_client, buffer_name, prioritized=False)
    counts = np.zeros(ITEMS)
    for _ in range(150):
        np.add.at(counts, buffer.sample(8)["v"], 1)  # 8 > len: with replacement
    assert ((counts - 200) ** 2 / 200).sum() < chi2_limit(ITEMS - 1)


def test_prioritized_draws_without_replacement_are_successive_softmax_draws(
    fake_client, buffer_name
):
    check_prioritized_pairs(filled(fake_client, buffer_name, prioritized=True), 300)


def test_prioritized_draws_with_replacement_follow_the_softmax(fake_client, buffer_name):
    check_prioritized_with_replacement(filled(fake_client, buffer_name, prioritized=True), 150)


def test_prioritized_sampling_refuses_undefined_draws(fake_client, buffer_name):
    buffer = ShardedReplayBuffer(fake_client, buffer_name, capacity=30, shards=3,
                          prioritized_sampling=True)
    buffer.add(items([1, 2], [0.0, -np.inf]))
    buffer.add(items([3], [-np.inf]))
    with pytest.raises(SamplingError, match="only 1 items have nonzero probability"):
        buffer.sample(2)
    assert buffer.sample(1)["v"].tolist() == [1]
    buffer.add(items([4], [np.inf]))
    with pytest.raises(SamplingError, match="log-reward \\+inf"):
        buffer.sample(1)


def test_a_shard_that_fails_its_draw_leaves_no_draw_recorded_on_the_others(
    fake_client, buffer_name, monkeypatch
):
    """A PER sample over shards commits one draw per shard; when one shard's commit fails
    (here: emptied meanwhile), the draws the other shards committed are taken back, so the
    failed sample leaves no count and no use anywhere."""
    from redisbuf import PERSampler
    from redisbuf.errors import EmptyBufferError
    from redisbuf.sampling import commits

    buffer = ShardedReplayBuffer(fake_client, buffer_name, capacity=60, shards=3, seed=5,
                          sampler=PERSampler(alpha=1.0, eps=0.0))
    for _ in range(9):  # a batch goes to one shard: several batches fill them all
        buffer.add({"x": np.arange(5)})
    assert all(len(shard) > 0 for shard in buffer.shards)
    buffer.sample_with_info(8)  # replicas made; this sample is recorded
    before = [(fake_client.hget(s.keys.meta, "sampled"), fake_client.hgetall(s.keys.uses))
              for s in buffer.shards]
    failing = buffer.shards[1].view
    draw = commits.replica_draw

    def fails_on_one_shard(shard, *args, **kwargs):
        if shard is failing:
            raise EmptyBufferError("emptied between the shard choice and its commit")
        return draw(shard, *args, **kwargs)

    monkeypatch.setattr(commits, "replica_draw", fails_on_one_shard)
    with pytest.raises(EmptyBufferError, match="emptied"):
        buffer.sample_with_info(60)  # every shard gets some draws
    after = [(fake_client.hget(s.keys.meta, "sampled"), fake_client.hgetall(s.keys.uses))
             for s in buffer.shards]
    assert after == before


@pytest.mark.parametrize("kind", ["uniform", "softmax"])
def test_a_shard_that_fails_its_part_of_a_global_draw_leaves_none_recorded(
    fake_client, buffer_name, monkeypatch, kind
):
    """The same for the draws that ask every shard at once for its part: a uniform draw
    whose shard sizes are asked first, and the shards' successive sequences of a softmax
    draw without replacement. When one shard fails, the others' draws are taken back."""
    from redisbuf.errors import EmptyBufferError

    buffer = ShardedReplayBuffer(fake_client, buffer_name, capacity=60, shards=3, seed=5,
                                 prioritized_sampling=kind == "softmax")
    for _ in range(9):  # a batch goes to one shard: several batches fill them all
        buffer.add({"x": np.arange(5), "log_rewards": np.zeros(5)})
    assert all(len(shard) > 0 for shard in buffer.shards)
    before = [(fake_client.hget(s.keys.meta, "sampled"), fake_client.hgetall(s.keys.uses))
              for s in buffer.shards]

    def fails(*args, **kwargs):
        raise EmptyBufferError("emptied between the shard choice and its draw")

    monkeypatch.setattr(buffer.shards[1], "_draw", fails)
    with pytest.raises(EmptyBufferError, match="emptied"):
        buffer.sample(30, replacement=False)  # every shard gives some items
    after = [(fake_client.hget(s.keys.meta, "sampled"), fake_client.hgetall(s.keys.uses))
             for s in buffer.shards]
    assert after == before


def test_shards_share_one_running_max_for_new_items(fake_client, buffer_name):
    """PER's new-item rule over shards: a new item gets the highest priority set on any
    shard (as in one buffer), not its own shard's. An update is one append, whose ids the
    server does not look up: a priority given to an id no longer stored raises it too,
    on every shard (as in one buffer)."""
    from redisbuf import PERSampler

    buffer = ShardedReplayBuffer(fake_client, buffer_name, capacity=30, shards=3, seed=2,
                          sampler=PERSampler(initial_priority=1.0))
    first = buffer.add({"x": np.arange(4)})
    k = int(first.ids[0] % 3)
    buffer.update_priority(first.ids[:1], [50.0])
    maxima = [float(fake_client.hget(s.keys.meta, "per_max")) for s in buffer.shards]
    assert maxima == [50.0, 50.0, 50.0]
    for _ in range(3):  # one add per shard: every shard gets new items
        added = buffer.add({"x": np.arange(2)})
        shard = buffer.shards[int(added.ids[0] % 3)]
        assert shard.priorities(added.ids // 3).tolist() == [50.0, 50.0]
    # explicit priorities raise it too, wherever the batch lands
    buffer.add({"x": np.arange(1)}, priorities=[70.0])
    assert {float(fake_client.hget(s.keys.meta, "per_max")) for s in buffer.shards} == {70.0}
    # an id no longer stored: not updated (counted 0), and its priority was given
    gone = (10**6) * 3 + k
    assert buffer.update_priority([gone], [99.0]) == 0
    assert {float(fake_client.hget(s.keys.meta, "per_max")) for s in buffer.shards} == {99.0}


@pytest.mark.parametrize("reset_by", ["this process", "another process"])
def test_the_shared_running_max_starts_again_after_a_clear(fake_client, buffer_name,
                                                           reset_by):
    """After a clear (by this buffer object or another one), the running max is the
    highest priority set since: 50 after 100 before the clear, on every shard, so a new
    item on another shard gets 50 (the review saw 1, initial_priority, there: this
    process skipped sharing 50 because it had shared 100 before the clear)."""
    from redisbuf import PERSampler

    def opened(seed: int) -> ShardedReplayBuffer:
        return ShardedReplayBuffer(fake_client, buffer_name, capacity=30, shards=3,
                                   seed=seed, sampler=PERSampler(initial_priority=1.0))

    buffer, other = opened(2), opened(3)
    first = buffer.add({"x": np.arange(4)})
    buffer.update_priority(first.ids[:1], [100.0])
    (buffer if reset_by == "this process" else other).clear()
    again = [buffer.add({"x": np.arange(2)}).ids for _ in range(3)]  # every shard
    buffer.update_priority(again[0][:1], [50.0])
    assert [float(fake_client.hget(s.keys.meta, "per_max")) for s in buffer.shards] == [50.0] * 3
    for _ in range(3):
        added = buffer.add({"x": np.arange(1)})
        shard = buffer.shards[int(added.ids[0] % 3)]
        assert shard.priorities([added.ids[0] // 3]).tolist() == [50.0]
