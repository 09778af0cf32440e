"""Waiting for a buffer to change (redisbuf/sampling/waiting.py): wake-up on add, timeouts,
no polling between changes, Ctrl-C, and several OS processes on a real server."""

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
from redisbuf.errors import WaitTimeoutError
from redisbuf.sampling.waiting import changed_channel, notify, wait_for

NEVER_RECHECK = 60.0  # long enough that only a notification can end a wait in a test


def _batch(n: int) -> dict[str, np.ndarray]:
    return {"x": np.arange(n, dtype=np.float32)[:, None], "log_rewards": np.zeros(n)}


def test_changed_channel_follows_the_meta_key() -> None:
    assert changed_channel("rb:{abc}:meta") == "rb:{abc}:changed"
    with pytest.raises(ValueError, match="meta key"):
        changed_channel("rb:{abc}:items")


def test_a_satisfied_check_returns_at_once_without_subscribing(client, buffer_name) -> None:
    buf = ReplayBuffer(client, buffer_name, capacity=10)
    calls = []

    def check():
        calls.append(1)
        return "ready"

    assert wait_for(client, buf.keys.meta, check, 0.0, lambda: "unused") == "ready"
    assert len(calls) == 1
    assert client.pubsub_numsub(changed_channel(buf.keys.meta))[0][1] == 0


def test_timeout_raises_the_described_error(client, buffer_name) -> None:
    buf = ReplayBuffer(client, buffer_name, capacity=10)
    start = time.monotonic()
    with pytest.raises(WaitTimeoutError, match=f"nothing in {buffer_name}") as info:
        wait_for(client, buf.keys.meta, lambda: None, 0.3, lambda: f"nothing in {buffer_name}")
    assert isinstance(info.value, TimeoutError)
    assert time.monotonic() - start >= 0.3
    # the subscription was closed on the way out
    assert client.pubsub_numsub(changed_channel(buf.keys.meta))[0][1] == 0


def test_negative_timeout_is_refused(client, buffer_name) -> None:
    buf = ReplayBuffer(client, buffer_name, capacity=10)
    with pytest.raises(ValueError, match="timeout"):
        wait_for(client, buf.keys.meta, lambda: None, -1.0, lambda: "x")


def test_an_add_from_another_thread_wakes_the_waiter(client, buffer_name) -> None:
    buf = ReplayBuffer(client, buffer_name, capacity=10)
    other = ReplayBuffer(client, buffer_name, capacity=10)
    checks = []

    def check():
        checks.append(len(buf))
        return len(buf) if len(buf) >= 3 else None

    timer = threading.Timer(0.2, lambda: other.add(_batch(3)))
    timer.start()
    try:  # without the wake-up: a hang (no recheck, no timeout)
        assert wait_for(client, buf.keys.meta, check, None, lambda: "x", recheck=NEVER_RECHECK) == 3
    finally:
        timer.join()
    # one check before subscribing, one after, one after the wake-up: no polling between
    assert checks == [0, 0, 3]


def test_notify_from_python_wakes_the_waiter(client, buffer_name) -> None:
    buf = ReplayBuffer(client, buffer_name, capacity=10)
    flag = []

    def release():
        flag.append(1)
        notify(client, buf.keys.meta)

    timer = threading.Timer(0.2, release)
    timer.start()
    try:
        result = wait_for(
            client, buf.keys.meta, lambda: "go" if flag else None, 30.0, lambda: "x",
            recheck=NEVER_RECHECK,
        )
    finally:
        timer.join()
    assert result == "go"


# -- real OS processes on a real server ----------------------------------------------------

_WAITER = """
import sys, time
from redisbuf import ReplayBuffer
from redisbuf.sampling.waiting import wait_for
url, name, need = sys.argv[1], sys.argv[2], int(sys.argv[3])
buf = ReplayBuffer(url, name, capacity=100)
checks = 0
def check():
    global checks
    checks += 1
    return len(buf) if len(buf) >= need else None
print("ready", flush=True)
try:
    got = wait_for(buf.client, buf.keys.meta, check, None, lambda: "x", recheck=60.0)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(3)
print("got", got, checks, time.monotonic(), flush=True)
"""


def _spawn_waiter(url: str, name: str, need: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(
        [sys.executable, "-c", _WAITER, url, name, str(need)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        preexec_fn=default_signals,  # the test sends SIGINT
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc


@pytest.mark.redis_server
@pytest.mark.multiprocess
def test_processes_waiting_all_wake_on_one_add(redis_server, real_client, buffer_name) -> None:
    waiters = [_spawn_waiter(redis_server.url, buffer_name, 5) for _ in range(3)]
    try:
        channel = changed_channel(ReplayBuffer(real_client, buffer_name, capacity=100).keys.meta)
        deadline = time.monotonic() + 30
        while real_client.pubsub_numsub(channel)[0][1] < 3 and time.monotonic() < deadline:
            time.sleep(0.05)  # test harness only: wait until all three are subscribed
        writer = ReplayBuffer(real_client, buffer_name, capacity=100)
        writer.add(_batch(2))  # not enough: each waiter checks once more and waits again
        writer.add(_batch(3))
        added = time.monotonic()
        for proc in waiters:
            out, err = proc.communicate(timeout=30)
            assert proc.returncode == 0, err
            _, got, checks, woke = out.split()
            assert int(got) == 5
            assert int(checks) <= 4  # before/after subscribing + one per add: no polling
            assert float(woke) - added < 10.0
    finally:
        for proc in waiters:
            proc.kill()


@pytest.mark.redis_server
@pytest.mark.multiprocess
def test_ctrl_c_interrupts_a_wait(redis_server, buffer_name) -> None:
    proc = _spawn_waiter(redis_server.url, buffer_name, 1)
    try:
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 3, err
        assert "interrupted" in out
    finally:
        proc.kill()
