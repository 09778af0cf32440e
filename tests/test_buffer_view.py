"""The interface between a buffer and its parts (redisbuf/sampling/base.py): the parts work
on a BufferView alone, and a sampler's state outlives a call's options (issue 33)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from redisbuf import PrioritizedSampler, ReplayBuffer, UniformSampler
from redisbuf.sampling import samplers
from redisbuf.sampling.base import BufferView
from redisbuf.sampling.replica import replica_of
from redisbuf.store import scripts
from redisbuf.store.keys import BufferKeys


def _items(count: int, start: int = 0) -> dict:
    return {"v": np.arange(start, start + count), "log_rewards": np.zeros(count)}


def test_a_sampler_draws_through_a_view_made_without_a_buffer(client, buffer_name):
    """A view of name, client, keys and a script runner is all a sampler needs."""
    ReplayBuffer(client, buffer_name, capacity=20).add(_items(10))
    calls: list[str] = []

    def run(script: str, keys: list[str], args: list[Any], read: bool = False) -> Any:
        calls.append(script)
        loaded = scripts.load(script)
        return (loaded.read if read else loaded)(client, keys, args)

    view = BufferView(buffer_name, client, BufferKeys(buffer_name), run)
    assert len(view) == 10 and calls == ["len"]  # lua/len.lua, through the view's runner
    calls.clear()
    draw = UniformSampler().draw(view, 4, np.random.default_rng(0))
    assert len(set(draw.ids)) == 4 and set(draw.ids) <= set(range(1, 11))
    assert len(draw.blobs) == 4 and all(blob for blob in draw.blobs)
    assert calls == ["sample_uniform"]  # the first draw knows no id range: the script's
    assert view.id_range is not None and view.id_range.length == 10
    # the next draw guesses the ids from the range the first saw
    again = UniformSampler(replacement=True).draw(view, 30, np.random.default_rng(1))
    assert len(again.ids) == 30 and set(again.ids) <= set(range(1, 11))
    assert calls == ["sample_uniform"]  # the guess went by a pipeline, not by the runner
    stored = client.hget(BufferKeys(buffer_name).meta, "sampled")
    assert int(stored) == 34


def test_replacement_per_call_keeps_the_sampler_and_its_id_range(
    fake_client, buffer_name, monkeypatch
):
    """sample(replacement=...) passes the option to the buffer's own sampler: the id range
    the first draw saw serves every later one, whatever each call's replacement."""
    buffer = ReplayBuffer(fake_client, buffer_name, capacity=50, seed=3)
    buffer.add(_items(40))
    sampler = buffer.sampler
    made: list[Any] = []
    init = samplers.UniformSampler.__init__

    def counted_init(self: Any, *args: Any, **kwargs: Any) -> None:
        made.append(self)
        init(self, *args, **kwargs)

    monkeypatch.setattr(samplers.UniformSampler, "__init__", counted_init)
    plain = samplers._draw_then_fetch
    plain_calls: list[int] = []
    monkeypatch.setattr(samplers, "_draw_then_fetch",
                        lambda *a, **k: plain_calls.append(1) or plain(*a, **k))
    buffer.sample(5, replacement=False)
    first = buffer.view.id_range
    assert first is not None and (first.first, first.length) == (1, 40)
    for replacement in (True, False, None, True):
        ids = buffer.sample_with_info(8, replacement=replacement).ids
        assert set(ids.tolist()) <= set(range(1, 41))
        if replacement is False or replacement is None:
            assert len(set(ids.tolist())) == 8
    assert made == []  # no sampler made per call
    assert buffer.sampler is sampler and buffer.view.id_range is first
    assert plain_calls == [1]  # only the first draw had no range to guess from
    assert int(fake_client.hget(buffer.keys.meta, "sampled")) == 5 + 4 * 8


def test_prioritized_replacement_per_call_keeps_one_replica(fake_client, buffer_name):
    buffer = ReplayBuffer(fake_client, buffer_name, capacity=50, sampler=PrioritizedSampler(),
                          seed=5)
    buffer.add(_items(30))
    buffer.sample(4)
    replica = buffer.view.replicas["softmax"]
    assert replica_of(buffer.view, "softmax") is replica
    assert len(buffer.sample_with_info(60, replacement=True).ids) == 60
    ids = buffer.sample_with_info(30, replacement=False).ids
    assert sorted(ids.tolist()) == list(range(1, 31))
    assert buffer.view.replicas == {"softmax": replica}


def test_the_view_runs_read_only_when_asked(fake_client, buffer_name):
    """run(..., read=True) reaches the buffer's runner as a read (the read-only variant)."""
    buffer = ReplayBuffer(fake_client, buffer_name, capacity=5)
    seen: list[tuple[str, bool]] = []
    run = buffer._run

    def spy(script: str, keys: list[str], args: list[Any], read: bool = False) -> Any:
        seen.append((script, read))
        return run(script, keys, args, read=read)

    buffer._run = spy  # type: ignore[method-assign]
    reply = buffer.view.run("lifetime_config", [buffer.keys.meta], ["", ""], read=True)
    assert [v in (b"", "") for v in reply] == [True, True]
    buffer.view.run("len", [buffer.keys.meta, buffer.keys.order], [])
    assert seen == [("lifetime_config", True), ("len", False)]


def test_stored_schema_refresh_reads_the_server_again(fake_client, buffer_name):
    buffer = ReplayBuffer(fake_client, buffer_name, capacity=5)
    assert buffer.stored_schema() is None
    other = ReplayBuffer(fake_client, buffer_name, capacity=5)
    other.add(_items(2))
    schema = buffer.stored_schema()  # none was stored: asked again
    assert schema is not None and set(schema["fields"]) == {"v", "log_rewards"}
    other.drop()
    ReplayBuffer(fake_client, buffer_name, capacity=5).add({"w": np.zeros((2, 3))})
    assert buffer.stored_schema() == schema  # the remembered one
    fresh = buffer.stored_schema(refresh=True)
    assert fresh is not None and "w" in fresh["fields"] and "v" not in fresh["fields"]


@pytest.mark.parametrize("rule", ["softmax", "per"])
def test_a_view_of_another_rule_raises_for_a_buffer_without_it(fake_client, buffer_name, rule):
    """A replica is the view's, made on first use; a rule the buffer has not turned on
    raises (and leaves no replica behind)."""
    buffer = ReplayBuffer(fake_client, buffer_name, capacity=5)
    buffer.add(_items(3))
    with pytest.raises(Exception, match="not enabled"):
        replica_of(buffer.view, rule)
    assert buffer.view.replicas == {}
