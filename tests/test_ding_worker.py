"""redisbuf.ding's worker buffers: NaiveReplayBuffer, AdvancedReplayBuffer,
EpisodeReplayBuffer, create_buffer and their EasyDict configs."""

from __future__ import annotations

import copy
import os
import time

import numpy as np
import pytest

from redisbuf.ding import (
    AdvancedReplayBuffer,
    EasyDict,
    EpisodeReplayBuffer,
    NaiveReplayBuffer,
    create_buffer,
    get_buffer_cls,
)


def cfg_of(cls, **changes) -> EasyDict:
    cfg = cls.default_config()
    for key, value in changes.items():
        cfg[key] = value
    return cfg


def transitions(count: int, start: int = 0, **extra) -> list[dict]:
    return [{"obs": np.full(2, i, np.float32), "data_id": str(i), **extra}
            for i in range(start, start + count)]


def test_default_config_is_an_easydict_of_dienignes_keys() -> None:
    cfg = AdvancedReplayBuffer.default_config()
    assert cfg.cfg_type == "AdvancedReplayBufferDict" and cfg.type == "advanced"
    assert cfg.thruput_controller.push_sample_rate_limit.max == float("inf")
    assert cfg.monitor.sampled_data_attr.print_freq == 200
    assert NaiveReplayBuffer.default_config().replay_buffer_size == 10000
    cfg.replay_buffer_size = 3  # a copy each time
    assert AdvancedReplayBuffer.default_config().replay_buffer_size == 4096
    deep = copy.deepcopy(cfg)
    assert type(deep.monitor) is EasyDict and deep == cfg


def test_a_plain_partial_dict_takes_the_defaults(client, buffer_name) -> None:
    buffer = NaiveReplayBuffer({"replay_buffer_size": 5}, url=client, name=buffer_name)
    assert buffer.replay_buffer_size == 5 and buffer._cfg.periodic_thruput_seconds == 60


def test_naive_push_sample_count(client, buffer_name) -> None:
    buffer = NaiveReplayBuffer(cfg_of(NaiveReplayBuffer, replay_buffer_size=64), url=client,
                               name=buffer_name)
    for data in transitions(100):
        buffer.push(data, 0)
    assert buffer.count() == 64 and buffer.push_count == 100
    buffer.push(transitions(10, 100), 0)
    assert buffer.count() == 64 and buffer.push_count == 110
    batch = buffer.sample(32, 0)
    assert len(batch) == 32 and len({d["data_id"] for d in batch}) == 32
    assert buffer.sample(1, 0, sample_range=slice(-1, None))[0]["data_id"] == "109"
    window = buffer.sample(5, 0, sample_range=slice(-10, -2))
    assert {d["data_id"] for d in window} <= {str(i) for i in range(100, 108)}
    assert buffer.sample(65, 0) is None and len(buffer.sample(65, 0, replace=True)) == 65
    assert buffer.sample(0, 0) == []
    buffer.update({"no_info": True})
    buffer.clear()
    assert buffer.count() == 0 and buffer.push_count == 0 and buffer.sample(1, 0) is None


def test_naive_state_and_files(client, buffer_name, tmp_path) -> None:
    buffer = NaiveReplayBuffer(cfg_of(NaiveReplayBuffer, replay_buffer_size=8), url=client,
                               name=buffer_name)
    buffer.push(transitions(10), 0)
    state = buffer.state_dict()
    assert [d["data_id"] for d in state["data"]] == [str(i) for i in range(2, 10)]
    path = str(tmp_path / "dir" / "data.hkl")
    buffer.save_data(path)
    other = NaiveReplayBuffer(cfg_of(NaiveReplayBuffer, replay_buffer_size=8), url=client)
    other.load_data(path)
    assert other.count() == 8 and other.push_count == 8
    other.load_state_dict({"data": transitions(2, 50)})
    assert other.count() == 8
    other.load_state_dict(state)  # a whole state replaces the items
    assert sorted(d["data_id"] for d in other.sample(8, 0)) == sorted(
        str(i) for i in range(2, 10))


def test_track_used_data_removes_files_that_leave(client, buffer_name, tmp_path) -> None:
    buffer = NaiveReplayBuffer(cfg_of(NaiveReplayBuffer, replay_buffer_size=4,
                                      enable_track_used_data=True), url=client, name=buffer_name)
    buffer.start()
    paths = []
    for i in range(6):
        path = tmp_path / f"obs{i}"
        path.write_bytes(b"x")
        paths.append(path)
    buffer.push([{"data_id": str(p)} for p in paths[:4]], 0)
    buffer.push([{"data_id": str(p)} for p in paths[4:]], 0)
    deadline = time.monotonic() + 30
    while any(p.exists() for p in paths[:2]) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [p.exists() for p in paths] == [False, False, True, True, True, True]
    buffer.close()  # clears: every file goes
    assert not any(os.path.exists(p) for p in paths)


def test_episode_buffer_holds_whole_episodes(client, buffer_name) -> None:
    buffer = EpisodeReplayBuffer(cfg_of(EpisodeReplayBuffer, replay_buffer_size=3), url=client,
                                 name=buffer_name)
    for length in (2, 5, 1, 4):
        buffer.push([transitions(length)], 0)
    assert buffer.episode_len == [5, 1, 4]
    assert sorted(len(e) for e in buffer.sample(3, 0)) == [1, 4, 5]


def advanced(client, name=None, **changes) -> AdvancedReplayBuffer:
    return AdvancedReplayBuffer(cfg_of(AdvancedReplayBuffer, **changes), url=client, name=name,
                                instance_name="test")


def test_advanced_keys_and_priorities(client, buffer_name) -> None:
    buffer = advanced(client, buffer_name, replay_buffer_size=8, alpha=1.0, beta=1.0,
                      anneal_step=0)
    data = transitions(4)
    data[0]["priority"] = 3.0
    data[1]["priority"] = None
    buffer.push(data, 0)
    buffer.push(7, 0)  # not a dict: refused
    assert buffer.count() == 4
    assert [d["replay_unique_id"] for d in data] == ["test_0", "test_1", "test_2", "test_3"]
    seen = {}
    for _ in range(1000):  # until each is drawn (the 1.0s 1 time in 6)
        for d in buffer.sample(4, 5):
            seen[d["replay_unique_id"]] = d
        if len(seen) == 4:
            break
    assert {k: v["priority"] for k, v in seen.items()} == {
        "test_0": 3.0, "test_1": 1.0, "test_2": 1.0, "test_3": 1.0}
    assert seen["test_0"]["IS"] == pytest.approx(1 / 3) and seen["test_1"]["IS"] == 1.0
    assert seen["test_2"]["staleness"] == -1 and seen["test_2"]["replay_buffer_idx"] == 2
    info = {"replay_unique_id": ["test_1", "test_2", "other_3"],
            "replay_buffer_idx": [1, 5, 3], "priority": [9.0, 9.0, 9.0]}
    buffer.update(info)  # test_2's idx does not match, other_3 is not ours: skipped
    assert buffer.sample(8, 0) is None  # 4 items / 8 < sample_min_limit_ratio 1
    priorities: dict[str, float] = {}
    for _ in range(1000):  # test_2 is drawn 1 time in 14: 80 draws missed it 1 run in 370
        priorities.update((d["replay_unique_id"], d["priority"]) for d in buffer.sample(4, 0))
        if {"test_1", "test_2"} <= priorities.keys():
            break
    assert priorities["test_1"] == pytest.approx(9.00001) and priorities["test_2"] == 1.0
    buffer.push({"new": 1}, 0)  # the running max from updates, with DI-engine's epsilon
    assert buffer.state_dict()["max_priority"] == pytest.approx(9.00001)


def test_advanced_max_use_and_staleness(client, buffer_name) -> None:
    buffer = advanced(client, buffer_name, replay_buffer_size=16, max_use=2, max_staleness=5)
    buffer.push(transitions(4, collect_iter=0), 0)
    buffer.push(transitions(2, 10, collect_iter=[3, 8]), 0)
    uses = {}
    while True:
        batch = buffer.sample(1, 4)
        if batch is None:
            break
        uses[batch[0]["data_id"]] = batch[0]["use"]
        assert batch[0]["staleness"] == 4 - (0 if int(batch[0]["data_id"]) < 10 else 3)
    assert set(uses.values()) == {2} and len(uses) == 6 and buffer.count() == 0
    buffer.push(transitions(3, collect_iter=0), 0)
    assert buffer.sample(1, 4) is not None and buffer.count() == 3  # staleness 4 < 5: kept
    assert buffer.sample(1, 5) is None and buffer.count() == 0  # staleness 5 >= 5: removed


@pytest.mark.parametrize(("max_use", "uses"), [(2.5, 3), (0, 1)])
def test_advanced_max_use_and_staleness_of_any_number(client, buffer_name, max_use,
                                                      uses) -> None:
    # DI-engine removes at use >= max_use and at staleness >= max_staleness
    buffer = advanced(client, buffer_name, replay_buffer_size=4, max_use=max_use,
                      max_staleness=2.5)
    buffer.push(transitions(1, collect_iter=0), 0)
    assert [buffer.sample(1, 0)[0]["use"] for _ in range(uses)] == list(range(1, uses + 1))
    assert buffer.count() == 0
    buffer.push(transitions(1, collect_iter=0), 0)
    assert buffer.sample(1, 2) is not None and buffer.sample(1, 3) is None  # 3 >= 2.5


def test_advanced_beta_anneals_and_is_shared(client, buffer_name) -> None:
    first = advanced(client, buffer_name, beta=0.4, anneal_step=10)
    second = advanced(client, buffer_name, beta=0.4, anneal_step=10)
    first.push(transitions(4), 0)
    for _ in range(2):
        first.sample(2, 0)
        second.sample(2, 0)
    assert first.beta == second.beta == pytest.approx(0.4 + 4 * 0.06)
    second.beta = 1.0
    assert first.beta == 1.0


def test_advanced_sample_min_limit_ratio_and_thruput(client, buffer_name) -> None:
    buffer = advanced(client, buffer_name, replay_buffer_size=100, thruput_controller={
        "push_sample_rate_limit": {"max": 2, "min": 0.5}, "window_seconds": 5,
        "sample_min_limit_ratio": 1.5})
    buffer.push(transitions(30), 0)
    for _ in range(3):
        assert buffer.sample(19, 0) is not None  # 30 / 57 >= 0.5
    assert buffer.sample(19, 0) is None  # 30 / 76 < 0.5
    assert buffer.sample(21, 0) is None  # 30 / 21 < 1.5
    for _ in range(2):
        buffer.push(transitions(30), 0)
    assert buffer.count() == 90
    buffer.push(transitions(30), 0)  # (90 + 30) / 57 > 2: refused
    assert buffer.count() == 90


def test_create_buffer_by_type(client) -> None:
    assert get_buffer_cls({"type": "advanced"}) is AdvancedReplayBuffer
    naive = create_buffer(cfg_of(NaiveReplayBuffer, replay_buffer_size=3), tb_logger=object(),
                          url=client)
    assert isinstance(naive, NaiveReplayBuffer) and naive.replay_buffer_size == 3
    with pytest.raises(KeyError, match="unknown buffer type"):
        get_buffer_cls({"type": "nope"})
