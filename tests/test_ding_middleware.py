"""redisbuf.ding's middleware: DI-engine's rules, the shipped ones with their state on
the server (two objects on one name stand for two processes)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cluster_helpers import chi2_limit

from redisbuf.ding import BufferedData, DequeBuffer
from redisbuf.ding.middleware import (
    PriorityExperienceReplay,
    clone_object,
    group_sample,
    padding,
    sample_range_view,
    staleness_check,
    use_time_check,
)
from redisbuf.errors import ConfigMismatchError


def item() -> dict:
    return {"obs": torch.randn(4), "reward": torch.randn(1), "info": "xxx"}


@pytest.fixture
def pair(client, buffer_name):
    """Two DequeBuffers on one name, as two processes hold them."""
    def make(size: int = 10):
        return (DequeBuffer(size, url=client, name=buffer_name),
                DequeBuffer(size, url=client, name=buffer_name))
    return make


def test_clone_object_passes_through_and_reads_are_copies(pair) -> None:
    buffer, _ = pair()
    buffer.use(clone_object())
    pushed = [{"key": "v1"}, ["a"], torch.tensor([1.0, 2.0])]
    for value in pushed:
        buffer.push(value)
    pushed[0]["key"] = "changed after push"
    for got in buffer.sample(3):
        if isinstance(got.data, dict):
            got.data["key"] = "v2"
        elif isinstance(got.data, list):
            got.data.append("b")
        else:
            got.data[0] = 3
    again = {type(g.data).__name__: g.data for g in buffer.sample(3)}
    assert again["dict"] == {"key": "v1"} and again["list"] == ["a"]
    assert again["Tensor"].tolist() == [1.0, 2.0]


def test_use_time_check_counts_on_the_server(pair) -> None:
    buffer, other = pair()
    buffer.use(use_time_check(buffer, max_use=2))
    other.use(use_time_check(other, max_use=2))
    for _ in range(6):
        buffer.push(item())
    first = buffer.sample(size=6)
    assert sorted(i.meta["use_count"] for i in first) == [1] * 6
    second = other.sample(size=6)  # the other process's draw is the second use
    assert sorted(i.meta["use_count"] for i in second) == [2] * 6
    assert buffer.count() == 0
    with pytest.raises(ValueError):
        buffer.sample(size=1)


def test_use_time_check_is_fixed_before_the_first_push(pair) -> None:
    buffer, other = pair()
    buffer.push(item())
    with pytest.raises(ConfigMismatchError, match="max_use"):
        buffer.use(use_time_check(buffer, max_use=3))
    other.use(use_time_check(other))  # inf: counts only
    assert other.sample(1)[0].meta["use_count"] == 1


@pytest.mark.parametrize(("max_use", "uses"), [(2.5, 3), (0, 1), (-1, 1), (np.int64(2), 2)])
def test_use_time_check_takes_any_number_as_dienigne(pair, max_use, uses) -> None:
    # DI-engine removes an item at the first use_count >= max_use
    buffer, _ = pair()
    buffer.use(use_time_check(buffer, max_use=max_use))
    buffer.push(item())
    counts = [buffer.sample(1)[0].meta["use_count"] for _ in range(uses)]
    assert counts == list(range(1, uses + 1)) and buffer.count() == 0
    with pytest.raises(ValueError, match="max_use"):
        use_time_check(buffer, max_use="2")


def test_staleness_check_of_a_fraction_keeps_what_dienigne_keeps(pair) -> None:
    buffer, _ = pair()
    buffer.use(staleness_check(buffer, max_staleness=2.5))  # removes staleness > 2.5
    for collected in (0, 1, 2):
        buffer.push(item(), meta={"train_iter_data_collected": collected})
    kept = buffer.sample(size=2, train_iter_sample_data=3)
    assert buffer.count() == 2 and {i.meta["staleness"] for i in kept} == {1, 2}
    with pytest.raises(ValueError, match="max_staleness"):
        staleness_check(buffer, max_staleness=-1)


def test_staleness_check_removes_for_every_process(pair) -> None:
    buffer, other = pair()
    buffer.use(staleness_check(buffer, max_staleness=10))
    other.use(staleness_check(other, max_staleness=10))
    with pytest.raises(AssertionError, match="train_iter_data_collected"):
        buffer.push(item())
    for _ in range(6):
        buffer.push(item(), meta={"train_iter_data_collected": 0})
    assert len(buffer.sample(size=6, train_iter_sample_data=9)) == 6
    edge = buffer.sample(size=6, train_iter_sample_data=10)
    assert [i.meta["staleness"] for i in edge] == [10] * 6
    for _ in range(2):
        buffer.push(item(), meta={"train_iter_data_collected": 5})
    assert other.count() == 8
    with pytest.raises(ValueError):
        other.sample(size=6, train_iter_sample_data=11)  # the other process's sample removes
    assert buffer.count() == 2
    buffer.push(item(), meta={"train_iter_data_collected": 0})  # already too stale: refused
    assert buffer.count() == 2


def test_sample_range_view_counts_negatives_from_the_size(pair) -> None:
    buffer, _ = pair()
    for letter, count in (("x", 5), ("y", 3), ("z", 2)):
        for _ in range(count):
            buffer.push({"data": letter})
    middle = buffer.view().use(sample_range_view(buffer, start=-5, end=-2))
    last = buffer.view().use(sample_range_view(buffer, start=-2))
    for _ in range(10):
        assert middle.sample(1)[0].data["data"] == "y"
        assert last.sample(1)[0].data["data"] == "z"


def test_padding_and_group_sample(pair) -> None:
    buffer, _ = pair()
    buffer.use(padding())
    for i in range(10):
        buffer.push(i, {"group": i & 5})  # groups of 3, 3, 2, 2
    for group in buffer.sample(4, groupby="group"):
        assert len(group) == 3 and len({i.meta["group"] for i in group}) == 1
    buffer.clear()
    grouped = buffer.view().use(padding(policy="none")).use(group_sample(size_in_group=5))
    for i in range(4):
        grouped.push(i, {"episode": 0})
    for i in range(6):
        grouped.push(i, {"episode": 1})
    for group in grouped.sample(2, groupby="episode"):
        assert len(group) == 5
        empty = [i for i in group if i.data is None]
        assert len(empty) == (1 if group[0].meta["episode"] == 0 else 0)
    with pytest.raises(Exception, match="groupby"):
        grouped.sample(1)
    unordered = buffer.view().use(group_sample(2, ordered_in_group=False))
    assert all(len(g) == 2 for g in unordered.sample(2, groupby="episode"))


def test_priority_experience_replay_as_dienigne_computes_it(pair) -> None:
    buffer, other = pair()
    buffer.use(PriorityExperienceReplay(buffer, IS_weight=True))
    other.use(PriorityExperienceReplay(other, IS_weight=True))
    for _ in range(10):
        buffer.push(item(), meta={"priority": 2.0})
    data = buffer.sample(size=10)
    assert len({d.index for d in data}) == 10  # equal priorities: one per slice
    for d in data:
        assert {"priority", "priority_idx", "priority_IS"} <= set(d.meta)
        assert d.meta["priority_IS"] == 1.0 and d.data["priority_IS"].tolist() == [1.0]
        d.meta["priority"] = 3.0
        assert other.update(d.index, d.data, d.meta)  # the other process updates
    drawn = buffer.sample(size=1)[0]
    assert drawn.meta["priority"] == 3.0
    buffer.delete(drawn.index)
    assert buffer.count() == 9 and len(buffer._middleware[0].buffer_idx) == 9
    # a new item gets the running max: 3.0 + 1e-5 (updates add DI-engine's epsilon)
    assert buffer._middleware[0].max_priority == pytest.approx(3.00001)


def test_priority_from_the_data_and_the_running_max(pair) -> None:
    buffer, _ = pair()
    per = PriorityExperienceReplay(buffer, IS_weight=True, priority_power_factor=1.0,
                                   IS_weight_power_factor=0.5)
    buffer.use(per)
    buffer.push({"obs": 1, "priority": 4.0})  # popped from the data
    buffer.push({"obs": 2}, meta={"priority": 1.0})
    buffer.push({"obs": 3})  # the running max: 1.0 (pushed priorities do not raise it)
    seen = {}
    for _ in range(30):
        for d in buffer.sample(size=6):
            seen[d.data["obs"]] = (d.meta["priority"], d.meta["priority_IS"], d.data)
    assert {k: v[0] for k, v in seen.items()} == {1: 4.0, 2: 1.0, 3: 1.0}
    assert "priority" not in seen[1][2]
    # IS = (p_min / p_i)^beta with beta 0.5 + anneal; p^alpha with alpha 1
    assert seen[1][1] == pytest.approx((1 / 4) ** per.IS_weight_power_factor, rel=1e-3)


def test_the_is_exponent_anneals_on_the_server(pair) -> None:
    buffer, other = pair()
    per = PriorityExperienceReplay(buffer, IS_weight_power_factor=0.4,
                                   IS_weight_anneal_train_iter=10)
    other_per = PriorityExperienceReplay(other, IS_weight_power_factor=0.4,
                                         IS_weight_anneal_train_iter=10)
    buffer.use(per)
    other.use(other_per)
    buffer.push({"a": 1}, meta={"priority": 1.0})
    buffer.push({"a": 2}, meta={"priority": 4.0})
    for _ in range(3):
        buffer.sample(2)
        other.sample(2)
    assert per.IS_weight_power_factor == other_per.IS_weight_power_factor == pytest.approx(
        0.4 + 6 * 0.06)
    state = per.state_dict()
    buffer.clear()  # DI-engine's clear keeps the exponent
    assert per.IS_weight_power_factor == pytest.approx(0.76)
    per.load_state_dict({"IS_weight_power_factor": 0.52})
    assert other_per.IS_weight_power_factor == pytest.approx(0.52)
    assert state["max_priority"] == 1.0


def test_priority_law_is_exact(pair) -> None:
    buffer, _ = pair(16)
    buffer.use(PriorityExperienceReplay(buffer, IS_weight=False, priority_power_factor=0.5))
    priorities = [1.0, 4.0, 9.0, 16.0]
    for p in priorities:
        buffer.push({"p": p}, meta={"priority": p})
    counts = dict.fromkeys(priorities, 0)
    rounds = 1500
    for _ in range(rounds):
        for d in buffer.sample(size=3):
            counts[d.data["p"]] += 1
            assert "priority_IS" not in d.meta
    expected = {p: rounds * 3 * p**0.5 / 10 for p in priorities}
    stat = sum((counts[p] - e) ** 2 / e for p, e in expected.items())
    assert stat < chi2_limit(3)


def test_priority_of_a_missing_update_and_bad_priorities(pair) -> None:
    buffer, _ = pair()
    buffer.use(PriorityExperienceReplay(buffer))
    index = buffer.push({"a": 1}).index
    assert not buffer.update("000000000099", None, {"priority": 1.0})
    with pytest.raises(AssertionError):
        buffer.update(index, None, {"priority": -1.0})
    with pytest.raises(AssertionError, match="dict-type meta"):
        buffer.update(index, {"a": 2}, None)
    empty = DequeBuffer(4, url=buffer.shared.client)
    empty.use(PriorityExperienceReplay(empty))
    with pytest.raises(ValueError):
        empty.sample(2)


def test_priority_updates_take_numpy_and_torch_numbers(pair) -> None:
    # DI-engine adds 1e-5 to whatever number it is given; a float32 or a tensor priority
    # (a learner's own td-errors) must set the item's priority, not be dropped
    buffer, other = pair()
    buffer.use(PriorityExperienceReplay(buffer, IS_weight=False, priority_power_factor=1.0))
    other.use(PriorityExperienceReplay(other, IS_weight=False, priority_power_factor=1.0))
    indices = [buffer.push({"a": i}).index for i in range(4)]
    given = [np.float32(6.0), torch.tensor(0.0), np.float16(0.0), torch.tensor([0.0])]
    for index, priority in zip(indices, given, strict=True):
        assert other.update(index, None, {"priority": priority})
    shared = buffer.shared
    stored = shared.engine.priorities([int(index) for index in indices])
    assert stored.tolist() == pytest.approx([6.00001, 1e-5, 1e-5, 1e-5])
    drawn = [d.data["a"] for _ in range(5) for d in buffer.sample(4)]
    assert drawn.count(0) >= 19  # each draw is item 0 with probability 6 / (6 + 3e-5)
    with pytest.raises(AssertionError):
        other.update(indices[0], None, {"priority": np.float32(-1.0)})


def test_a_middleware_chain_sees_the_shipped_ones_results(pair) -> None:
    buffer, _ = pair()
    seen = []

    def spy(action, chain, *args, **kwargs):
        out = chain(*args, **kwargs)
        if action == "sample":
            seen.extend(i.meta.get("use_count") for i in out)
        return out

    buffer.use(spy).use(use_time_check(buffer, max_use=5))
    buffer.push(1)
    buffer.sample(1)
    assert seen == [1]
    assert isinstance(buffer.sample(1)[0], BufferedData)
