"""redisbuf.torchrl_slices: TorchRL's slice sampling on a shared SequenceBuffer."""

from __future__ import annotations

import pickle
import uuid

import pytest
from process_helpers import fresh_context

pytest.importorskip("torchrl", reason="torchrl is not importable (pip install 'redisbuf[torchrl]')")

import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torchrl.data import ReplayBuffer, TensorDictReplayBuffer  # noqa: E402
from torchrl.data.replay_buffers.samplers import (  # noqa: E402
    PrioritizedSampler,
    PrioritizedSliceSampler,
    RandomSampler,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)
from torchrl.data.replay_buffers.writers import RoundRobinWriter  # noqa: E402
from torchrl_slices_helpers import epoch_reader, slice_reader, steps_of, writer  # noqa: E402

from redisbuf.errors import ConfigMismatchError, InvalidBatchError  # noqa: E402
from redisbuf.torchrl import EmptyStorageError  # noqa: E402
from redisbuf.torchrl_slices import (  # noqa: E402
    STEP_INDEX_BASE,
    RedisbufPrioritizedSliceSampler,
    RedisbufSliceSampler,
    RedisbufSliceSamplerWithoutReplacement,
    RedisbufSliceStorage,
)


@pytest.fixture
def name() -> str:
    return f"slices-{uuid.uuid4().hex[:8]}"


def buffer(client, name, sampler, batch_size=40, envs=4, **kwargs):
    storage = RedisbufSliceStorage(client, name, 100 * envs, num_environments=envs, **kwargs)
    return TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=batch_size)


def check_slices(sample, num_slices: int, done_every: int = 10) -> None:
    """Each row: consecutive steps of one environment inside one trajectory."""
    rows = sample.reshape(num_slices, -1)
    for row in range(num_slices):
        env, step = rows["env"][row], rows["step"][row]
        assert (env == env[0]).all()
        assert (step.diff() == 1).all()
        # dones at steps done_every - 1, 2 * done_every - 1, ...: none but at the end
        assert not ((step[:-1] + 1) % done_every == 0).any()
        assert (rows["index"][row] == env * STEP_INDEX_BASE + step).all()
        last = [False] * (step.numel() - 1) + [True]
        assert rows["next", "truncated"][row, :, 0].tolist() == last


def test_extend_n_by_t_goes_to_each_environment_and_samples_slice_by_slice(client, name):
    rb = buffer(client, name, RedisbufSliceSampler(slice_len=5))
    index = rb.extend(steps_of(0, 4, 30))
    assert index.shape == (4, 30)
    assert index[2, 7] == 2 * STEP_INDEX_BASE + 7
    assert len(rb) == 120
    for _ in range(5):
        sample = rb.sample()
        assert sample.batch_size == (40,)
        check_slices(sample, 8)
    sample = rb.sample(20)
    check_slices(sample, 4)


def test_num_slices_and_info_keys(client, name):
    rb = buffer(client, name, RedisbufSliceSampler(num_slices=4), batch_size=12)
    rb.extend(steps_of(0, 4, 30))
    sample, info = rb.sample(return_info=True)
    check_slices(sample, 4)
    done = sample["next", "done"].reshape(4, 3)
    assert done[:, -1].all()  # the stored done, or-ed with the slice's end
    assert not sample["next", "terminated"].any()
    assert info["index"].shape == (12,)


def test_plain_replay_buffer_returns_info(client, name):
    storage = RedisbufSliceStorage(client, name, 400, num_environments=4)
    rb = ReplayBuffer(storage=storage, sampler=RedisbufSliceSampler(slice_len=4), batch_size=8)
    rb.extend(steps_of(0, 4, 30))
    sample, info = rb.sample(return_info=True)
    assert sample.batch_size == (8,)
    assert info[("next", "truncated")].reshape(2, 4)[:, -1].all()


def test_extend_t_goes_to_the_storage_env_and_add_appends_one_step(client, name):
    storage = RedisbufSliceStorage(client, name, 400, num_environments=4, env=2)
    rb = TensorDictReplayBuffer(storage=storage, sampler=RedisbufSliceSampler(slice_len=3),
                                batch_size=9)
    index = rb.extend(steps_of(2, 1, 12)[0])
    assert index.tolist() == [2 * STEP_INDEX_BASE + t for t in range(12)]
    assert storage.buffer.env_range(2) == (0, 12) and storage.buffer.env_range(0) == (0, 0)
    assert rb.add(steps_of(2, 1, 13)[0, 12]) == 2 * STEP_INDEX_BASE + 12
    sample = rb.sample()
    assert (sample["env"] == 2).all()
    check_slices(sample, 3)
    assert storage.get(torch.tensor([2 * STEP_INDEX_BASE + 4]))["step"].tolist() == [4]
    assert storage.contains(torch.tensor([2 * STEP_INDEX_BASE + 4, 5])).tolist() == [True, False]


def test_slices_never_cross_a_done_and_short_trajectories_are_never_drawn(client, name):
    rb = buffer(client, name, RedisbufSliceSampler(slice_len=4), batch_size=4, envs=1)
    data = steps_of(0, 1, 12, done_every=3)  # trajectories of 3 steps: no slice of 4
    rb.extend(data)
    with pytest.raises(EmptyStorageError):
        rb.sample()
    rb.extend(steps_of(0, 1, 8, done_every=100))  # 8 steps, the first trajectory not ended
    for _ in range(10):
        step = rb.sample()["step"]
        assert (step.diff() == 1).all() and step[0] <= 4


def test_torchrl_slice_sampler_maps_to_ours(client, name):
    rb = buffer(client, name, SliceSampler(slice_len=5, end_key=("next", "done")))
    assert type(rb._sampler) is RedisbufSliceSampler and rb._sampler.slice_len == 5
    rb.extend(steps_of(0, 4, 30))
    check_slices(rb.sample(), 8)


def test_refusals(client, name):
    with pytest.raises(TypeError, match="num_slices or slice_len"):
        RedisbufSliceSampler()
    with pytest.raises(TypeError, match="num_slices or slice_len"):
        RedisbufSliceSampler(num_slices=2, slice_len=3)
    with pytest.raises(ValueError, match="strict_length=False"):
        RedisbufSliceSampler(slice_len=3, strict_length=False)
    with pytest.raises(ValueError, match="strict_length=False"):
        buffer(client, name, SliceSampler(slice_len=3, strict_length=False))
    with pytest.raises(ValueError, match="span"):
        buffer(client, name, SliceSampler(slice_len=3, span=True))
    with pytest.raises(ValueError, match="multiple"):
        RedisbufSliceStorage(client, name, 10, num_environments=4)
    with pytest.raises(ValueError, match="strict_length=False"):
        buffer(client, name, SliceSamplerWithoutReplacement(slice_len=3, strict_length=False))
    for sampler in (RandomSampler(), None):
        with pytest.raises(TypeError, match="RedisbufSliceSampler"):
            buffer(client, name, sampler)
    storage = RedisbufSliceStorage(client, name, 400, num_environments=4)
    with pytest.raises(TypeError, match="RedisbufSliceWriter"):
        ReplayBuffer(storage=storage, sampler=RedisbufSliceSampler(slice_len=3),
                     writer=RoundRobinWriter())
    rb = buffer(client, name, RedisbufSliceSampler(slice_len=3), batch_size=10)
    with pytest.raises(EmptyStorageError, match="empty storage"):
        rb.sample(9)
    rb.extend(steps_of(0, 4, 30))
    with pytest.raises(RuntimeError, match="divisible by the slice length"):
        rb.sample()
    with pytest.raises(InvalidBatchError, match="environments"):
        rb.extend(steps_of(0, 5, 3))
    with pytest.raises(InvalidBatchError, match="done_key"):
        rb.extend(TensorDict({"step": torch.arange(3)}, [3]))
    with pytest.raises(InvalidBatchError, match=r"\[N, T\]"):
        rb.extend(steps_of(0, 4, 3).unsqueeze(0))
    with pytest.raises(RuntimeError, match="end_key"):
        buffer(client, name, RedisbufSliceSampler(slice_len=3, end_key="done")).sample(9)
    with pytest.raises(ConfigMismatchError, match="prioritized_sampling=True"):
        buffer(client, name, RedisbufPrioritizedSliceSampler(slice_len=3)).sample(9)


def test_prioritized_slices_follow_the_priority_of_their_first_step(client, name):
    sampler = RedisbufPrioritizedSliceSampler(slice_len=5, alpha=1.0, beta=0.5)
    rb = buffer(client, name, sampler, prioritized_sampling=True, seed=1)
    rb.extend(steps_of(0, 4, 30))
    check_slices(rb.sample(), 8)
    sample = rb.sample()
    assert sample["priority_weight"].shape == (40,)
    # every step priority ~0 but env 1's step 12: every slice is env 1's 12..16
    rb.update_priority(torch.arange(4 * 30).reshape(4, 30).remainder(30)
                       + torch.arange(4)[:, None] * STEP_INDEX_BASE, torch.zeros(120))
    rb.update_priority(torch.tensor([STEP_INDEX_BASE + 12]), torch.tensor([5.0]))
    sample = rb.sample()
    assert (sample["env"] == 1).all()
    assert sample["step"].reshape(8, 5).tolist() == [list(range(12, 17))] * 8


def test_torchrl_prioritized_slice_sampler_maps_to_ours(client, name, monkeypatch):
    # TorchRL builds its C++ sum tree in _init, which does not load on every torch (not on
    # 2.13): the mapping does not need it
    monkeypatch.setattr(PrioritizedSampler, "_init", lambda self: None)
    rb = buffer(client, name, PrioritizedSliceSampler(max_capacity=400, alpha=0.7, beta=0.3,
                                                      slice_len=5), prioritized_sampling=True)
    assert type(rb._sampler) is RedisbufPrioritizedSliceSampler
    assert (rb._sampler.alpha, rb._sampler.beta) == (0.7, 0.3)


def test_empty_clears_every_step(client, name):
    rb = buffer(client, name, RedisbufSliceSampler(slice_len=5))
    rb.extend(steps_of(0, 4, 30))
    rb.empty()
    assert len(rb) == 0
    rb.extend(steps_of(0, 4, 10))
    assert len(rb) == 40


@pytest.mark.redis_server
def test_storage_pickles_by_url(redis_server, name):
    storage = RedisbufSliceStorage(redis_server.url, name, 40, num_environments=2, env=1)
    storage.extend(steps_of(1, 1, 5))
    clone = pickle.loads(pickle.dumps(storage))
    assert len(clone) == 5 and clone.env == 1 and clone.max_size == 40


@pytest.mark.redis_server
@pytest.mark.multiprocess
def test_two_processes_write_environments_a_third_samples_slices_of_both(redis_server, name):
    ctx = fresh_context()
    results = ctx.Queue()
    writers = [ctx.Process(target=writer, args=(redis_server.url, name, first, results))
               for first in (0, 2)]
    for proc in writers:
        proc.start()
    replies = [results.get(timeout=120) for _ in writers]
    for proc in writers:
        proc.join(timeout=60)
    assert all("error" not in reply for reply in replies), replies
    reader = ctx.Process(target=slice_reader, args=(redis_server.url, name, results))
    reader.start()
    reply = results.get(timeout=120)
    reader.join(timeout=60)
    assert "error" not in reply, reply["error"]
    assert [proc.exitcode for proc in (*writers, reader)] == [0, 0, 0]
    envs = set()
    for env, steps in reply["slices"]:
        assert len(set(env)) == 1 and steps == list(range(steps[0], steps[0] + 5))
        assert steps[0] % 10 <= 5  # inside one trajectory of 10 steps
        envs.add(env[0])
    assert envs == {0, 1, 2, 3}  # 160 slices over 4 envs: each drawn, p(miss) < 1e-19


def epoch_of(rb, length: int) -> list[list[tuple[int, int]]]:
    """The batches of one epoch: each batch's slices as (env, first step)."""
    batches = []
    for batch in rb:
        rows = batch.reshape(-1, length)
        check_slices(batch, rows.shape[0])
        batches.append([(int(rows["env"][r, 0]), int(rows["step"][r, 0]))
                        for r in range(rows.shape[0])])
    return batches


def test_without_replacement_draws_each_slice_once_an_epoch(client, name):
    # 4 environments x 30 steps, an episode every 10: 12 trajectories, 2 slices of 5 each
    rb = buffer(client, name, SliceSamplerWithoutReplacement(slice_len=5), batch_size=20)
    assert type(rb._sampler) is RedisbufSliceSamplerWithoutReplacement
    rb.extend(steps_of(0, 4, 30))
    every = {(env, start) for env in range(4) for start in (0, 5, 10, 15, 20, 25)}
    for _ in range(2):  # the next epoch starts by itself
        batches = epoch_of(rb, 5)
        drawn = [piece for batch in batches for piece in batch]
        assert sorted(drawn) == sorted(every)  # each once
        for batch in batches:  # one slice per trajectory in a batch
            assert len({(env, start // 10) for env, start in batch}) == len(batch)
        assert rb._sampler.ran_out


def test_without_replacement_in_order_and_drop_last(client, name):
    rb = buffer(client, name, RedisbufSliceSamplerWithoutReplacement(slice_len=5,
                                                                     shuffle=False,
                                                                     drop_last=True),
                batch_size=15, envs=1)
    rb.extend(steps_of(0, 1, 30))  # 3 trajectories of 10: 6 slices, 3 a batch at most
    batches = epoch_of(rb, 5)
    assert batches == [[(0, 0), (0, 10), (0, 20)], [(0, 5), (0, 15), (0, 25)]]
    rb.extend(steps_of(0, 1, 5)[:, :4])  # 4 more steps: no new slice in a trajectory
    assert epoch_of(rb, 5) == batches


def test_without_replacement_skips_evicted_slices(client, name):
    storage = RedisbufSliceStorage(client, name, 30, num_environments=1)
    rb = TensorDictReplayBuffer(storage=storage, batch_size=5,
                                sampler=RedisbufSliceSamplerWithoutReplacement(slice_len=5,
                                                                               shuffle=False))
    rb.extend(steps_of(0, 1, 30))
    first = rb.sample()["step"].tolist()
    assert first == [0, 1, 2, 3, 4]
    rb.extend(steps_of(0, 1, 40)[:, 30:])  # evicts steps 0-9: slice (0, 5) goes
    drawn = epoch_of(rb, 5)
    assert (0, 5) not in [piece for batch in drawn for piece in batch]
    assert [piece for batch in drawn for piece in batch][0] == (0, 10)


@pytest.mark.redis_server
@pytest.mark.multiprocess
def test_two_processes_each_run_their_own_epoch_over_the_same_slices(redis_server, name):
    storage = RedisbufSliceStorage(redis_server.url, name, 400, num_environments=4)
    storage.extend(steps_of(0, 4, 30))
    ctx = fresh_context()
    barrier, results = ctx.Barrier(2), ctx.Queue()
    readers = [ctx.Process(target=epoch_reader,
                           args=(redis_server.url, name, seed, barrier, results))
               for seed in (1, 2)]
    for proc in readers:
        proc.start()
    replies = [results.get(timeout=180) for _ in readers]
    for proc in readers:
        proc.join(timeout=60)
    every = sorted((env, start) for env in range(4) for start in (0, 5, 10, 15, 20, 25))
    for reply in replies:  # nothing consumed on the server: each sees all, each once
        assert "error" not in reply, reply
        assert sorted(reply["slices"]) == every
