"""sample(n, block=True, timeout=...): waits for items that any process adds (MineStudio's
waiting fetch), times out with a TimeoutError naming the buffer, and Ctrl-C stops it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from process_helpers import default_signals

from redisbuf import ReplayBuffer
from redisbuf.errors import EmptyBufferError, WaitTimeoutError


def _batch(n: int) -> dict[str, np.ndarray]:
    return {"x": np.arange(n, dtype=np.int64)[:, None], "log_rewards": np.zeros(n)}


def _later(delay: float, fn) -> threading.Timer:
    timer = threading.Timer(delay, fn)
    timer.start()
    return timer


def test_block_waits_for_an_add(client, buffer_name) -> None:
    buf = ReplayBuffer(client, buffer_name, capacity=10, seed=0)
    other = ReplayBuffer(client, buffer_name, capacity=10)
    timer = _later(0.2, lambda: other.add(_batch(3)))
    try:
        info = buf.sample_with_info(3, block=True, timeout=30)
    finally:
        timer.join()
    assert sorted(info.ids.tolist()) == [1, 2, 3]


def test_block_waits_for_n_items_or_min_size(client, buffer_name) -> None:
    buf = ReplayBuffer(client, buffer_name, capacity=10, seed=0)
    other = ReplayBuffer(client, buffer_name, capacity=10)
    other.add(_batch(1))
    timer = _later(0.2, lambda: (other.add(_batch(1)), other.add(_batch(1))))
    try:
        batch = buf.sample(1, block=True, timeout=30, min_size=3)
    finally:
        timer.join()
    assert len(buf) == 3 and batch["x"].shape == (1, 1)
    # min_size below n: draws as soon as min_size items are there (with replacement)
    assert buf.sample(5, block=True, timeout=5, min_size=2)["x"].shape == (5, 1)


def test_block_on_a_buffer_another_client_drops_raises(client, buffer_name) -> None:
    """A buffer dropped while a blocking sample waits for items never comes back: the
    wait raises NoSuchBufferError, as a sample without block does (the review saw it
    wait for good, and a blocking Prefetcher's next() hang)."""
    from redisbuf.errors import NoSuchBufferError

    buf = ReplayBuffer(client, buffer_name, capacity=10)
    buf.add(_batch(1))
    timer = _later(0.2, lambda: ReplayBuffer.open(client, buffer_name).drop())
    try:
        with pytest.raises(NoSuchBufferError, match="does not exist"):
            buf.sample(4, block=True, timeout=None)  # without the drop: a hang
    finally:
        timer.join()


def test_per_refuses_draws_without_replacement(client, buffer_name) -> None:
    """PERSampler draws with replacement only; asking for draws without it raises at
    once instead of returning repeated ids (the review saw 46 of 50 batches with one),
    and nothing is counted."""
    from redisbuf import PERSampler

    buf = ReplayBuffer(client, buffer_name, capacity=10, sampler=PERSampler(), seed=0)
    buf.add(_batch(4))
    with pytest.raises(ValueError, match="PERSampler draws with replacement"):
        buf.sample(4, replacement=False)
    with pytest.raises(ValueError, match="replacement=False is not available"):
        buf.sample_with_info(2, replacement=False, block=True, timeout=1)
    assert buf.stats()["sampled"] == 0
    assert len(buf.sample_with_info(4, replacement=True).ids) == 4


def test_block_times_out_naming_the_buffer(client, buffer_name) -> None:
    buf = ReplayBuffer(client, buffer_name, capacity=10)
    buf.add(_batch(1))
    start = time.monotonic()
    with pytest.raises(WaitTimeoutError, match=f"'{buffer_name}'.*waited 0.2 s for 2") as info:
        buf.sample(2, block=True, timeout=0.2)
    assert isinstance(info.value, TimeoutError)
    assert time.monotonic() - start >= 0.2


def test_without_block_an_empty_buffer_still_raises_at_once(client, buffer_name) -> None:
    buf = ReplayBuffer(client, buffer_name, capacity=10)
    with pytest.raises(EmptyBufferError):
        buf.sample(1)


@pytest.mark.parametrize("kwargs", [{"min_size": 0}, {"min_size": 1.5}, {"timeout": -1}])
def test_bad_blocking_arguments(client, buffer_name, kwargs) -> None:
    buf = ReplayBuffer(client, buffer_name, capacity=10)
    buf.add(_batch(1))
    with pytest.raises(ValueError):
        buf.sample(2, block=True, **kwargs)


_SAMPLER = """
import sys, time
import redisbuf.sampling.waiting as waiting
waiting.DEFAULT_RECHECK = 600.0  # only a notification can end the wait in this test
from redisbuf import ReplayBuffer
buf = ReplayBuffer(sys.argv[1], sys.argv[2], capacity=100, seed=1)
print("ready", flush=True)
try:
    batch = buf.sample(4, block=True, timeout=None)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(3)
print("got", batch["x"].shape[0], flush=True)
"""


def _spawn(url: str, name: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-c", _SAMPLER, url, name], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=default_signals)  # the test sends SIGINT
    assert proc.stdout.readline().strip() == "ready"
    return proc


@pytest.mark.redis_server
@pytest.mark.multiprocess
def test_processes_blocked_in_sample_wake_on_an_add(redis_server, real_client, buffer_name):
    procs = [_spawn(redis_server.url, buffer_name) for _ in range(3)]
    try:
        writer = ReplayBuffer(real_client, buffer_name, capacity=100)
        channel = f"rb:{{{buffer_name}}}:changed"
        deadline = time.monotonic() + 30
        while real_client.pubsub_numsub(channel)[0][1] < 3 and time.monotonic() < deadline:
            time.sleep(0.05)  # harness only: until all three are subscribed
        writer.add(_batch(4))
        for proc in procs:
            out, err = proc.communicate(timeout=60)  # far below the 600 s re-check
            assert proc.returncode == 0, err
            assert out.split() == ["got", "4"]
    finally:
        for proc in procs:
            proc.kill()


@pytest.mark.redis_server
@pytest.mark.multiprocess
def test_ctrl_c_interrupts_a_blocked_sample(redis_server, buffer_name) -> None:
    proc = _spawn(redis_server.url, buffer_name)
    try:
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 3, err
        assert "interrupted" in out
    finally:
        proc.kill()


_PER_SAMPLER = """
import sys
import redisbuf.sampling.waiting as waiting
waiting.DEFAULT_RECHECK = 600.0  # only a notification can end the wait in this test
from redisbuf import PERSampler, ReplayBuffer
buf = ReplayBuffer(sys.argv[1], sys.argv[2], capacity=100, seed=1,
                   sampler=PERSampler(alpha=1.0, eps=0.0))
print("ready", flush=True)
info = buf.sample_with_info(4, block=True, timeout=None)
print("got", *sorted(set(info.ids.tolist())), flush=True)
"""


@pytest.mark.redis_server
@pytest.mark.multiprocess
def test_a_sampler_blocked_on_zero_mass_wakes_on_an_update(redis_server, real_client,
                                                           buffer_name):
    """A PER sampler blocked because every priority is 0 (eps 0: nothing can be drawn)
    wakes when another process's update_priority gives one mass: the update publishes on
    the change channel as an add does (it once did not, and the waiter slept until its
    re-check, 2 s by default)."""
    from redisbuf import PERSampler

    writer = ReplayBuffer(real_client, buffer_name, capacity=100,
                          sampler=PERSampler(alpha=1.0, eps=0.0))
    ids = writer.add(_batch(6), priorities=np.zeros(6)).ids.tolist()
    env = {**os.environ, "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-c", _PER_SAMPLER, redis_server.url, buffer_name],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "ready"
        channel = f"rb:{{{buffer_name}}}:changed"
        deadline = time.monotonic() + 30
        while real_client.pubsub_numsub(channel)[0][1] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)  # harness only: until it is subscribed (blocked)
        writer.update_priority([ids[2]], [5.0])
        out, err = proc.communicate(timeout=60)  # far below the 600 s re-check
        assert proc.returncode == 0, err
        assert out.split() == ["got", str(ids[2])]
    finally:
        proc.kill()
