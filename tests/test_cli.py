"""The ``redisbuf`` command: demo (real processes, embedded or given server), worker,
inspect, errors, and Ctrl-C / SIGTERM clean-up."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
from process_helpers import alive

from redisbuf import PERSampler, ReplayBuffer, cli
from redisbuf.cli.inspect import redis_cli_lines
from redisbuf.demos.processes import DemoConfig, DemoError, run_demo
from redisbuf.envs import HyperGrid
from redisbuf.servers.embedded import EmbeddedServer

TIMEOUT = 120  # seconds for any one subprocess; each normally takes a few


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "REDISBUF_URL"}
    env.update(PYTHONUNBUFFERED="1", COLUMNS="200", NO_COLOR="1", **extra)
    return env


def _default_sigint() -> None:
    # a shell that starts a job in the background ignores SIGINT for it, and Python keeps
    # an ignored SIGINT ignored: give the child the default so it raises KeyboardInterrupt
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def redisbuf_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "redisbuf", *args]


def run_cli(*args: str, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        redisbuf_cmd(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
        stdin=subprocess.DEVNULL,
    )


def start_cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        redisbuf_cmd(*args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=_env(),
        preexec_fn=_default_sigint,
    )


def child_pids(pid: int) -> set[int]:
    pids: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        text = (task / "children").read_text().split()
        pids.update(int(x) for x in text)
    return pids


def wait_for(predicate, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def inserted(client: redis.Redis, name: str) -> int:
    return int(client.hget(f"rb:{{{name}}}:meta", "inserted") or 0)


def assert_one_error_line(stderr: str, *needles: str) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    for needle in needles:
        assert needle in lines[0], stderr


@pytest.fixture
def server_client(redis_server: EmbeddedServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


# -- demo ------------------------------------------------------------------------------


@pytest.mark.redis_server
@pytest.mark.multiprocess
def test_demo_against_a_server_fills_one_shared_buffer(redis_server, server_client, buffer_name):
    proc = run_cli(
        "demo", "--url", redis_server.url, "--name", buffer_name, "--workers", "2",
        "--batches", "10", "--batch-size", "32", "--capacity", "500", "--top", "3",
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for text in ("items added", "items evicted", "items sampled", "length / capacity",
                 "items/s", "Top 3 log-rewards", "terminal state",
                 f"HGETALL 'rb:{{{buffer_name}}}:meta'", f"redisbuf inspect {buffer_name}"):
        assert text in out, out
    assert "500 / 500 (consistent" in out
    assert "Traceback" not in proc.stderr

    buffer = ReplayBuffer.open(server_client, buffer_name)
    stats = buffer.stats()
    assert stats["inserted"] == 2 * 10 * 32
    assert stats["sampled"] == 2 * 10 * 32
    assert len(buffer) <= buffer.capacity == 500
    assert stats["inserted"] - stats["evicted"] == len(buffer) == 500
    assert stats["kind"] == "trajectories"
    # FIFO: the newest 500 ids are kept
    order = server_client.zrange(buffer.keys.order, 0, -1)
    assert [int(x) for x in order] == list(range(641 - 500, 641))


@pytest.mark.redis_server
@pytest.mark.multiprocess
def test_demo_prioritized_evicts_lowest_rewards(redis_server, server_client, buffer_name):
    proc = run_cli(
        "demo", "--url", redis_server.url, "--name", buffer_name, "--workers", "2",
        "--batches", "6", "--batch-size", "32", "--capacity", "100",
        "--prioritized", "--prioritized-capacity",
    )
    assert proc.returncode == 0, proc.stderr
    assert "lowest-reward eviction, prioritized sampling" in proc.stdout
    buffer = ReplayBuffer.open(server_client, buffer_name)
    stats = buffer.stats()
    assert stats["eviction"] == "reward" and stats["prioritized_sampling_ready"]
    assert stats["inserted"] - stats["evicted"] == len(buffer) == 100
    # the workers' trajectories are reproducible from the seed: the buffer must hold the
    # 100 highest log-rewards of all 384 inserted (the kept minimum never decreases)
    env = HyperGrid()
    every = np.concatenate([
        env.sample_trajectories(32, rng).log_rewards.numpy()
        for rng in (np.random.default_rng([0, index]) for index in range(2))
        for _ in range(6)
    ])
    kept = sorted(score for _, score in buffer.top(100))
    assert kept == pytest.approx(sorted(every)[-100:])


@pytest.mark.multiprocess
def test_demo_without_url_runs_on_an_embedded_server_and_stops_it():
    proc = run_cli("demo", "--workers", "2", "--batches", "4", "--batch-size", "16")
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("Embedded Redis:"), proc.stdout
    pid = int(first.split(" pid ")[1].split()[0])
    assert not alive(pid)
    assert "128 / 10000 (consistent" in proc.stdout
    assert "The embedded server stops now" in proc.stdout


@pytest.mark.multiprocess
@pytest.mark.parametrize("signum, code, word", [
    (signal.SIGINT, cli.EXIT_INTERRUPTED, "interrupted"),
    (signal.SIGTERM, cli.EXIT_TERMINATED, "terminated"),
])
def test_signal_stops_workers_and_embedded_server(signum, code, word):
    proc = start_cli("demo", "--workers", "2", "--batches", "1000000", "--batch-size", "16")
    try:
        first = proc.stdout.readline()
        assert first.startswith("Embedded Redis:"), first + proc.stderr.read()
        server_pid = int(first.split(" pid ")[1].split()[0])
        url = first.split(" at ")[1].split()[0]
        client = redis.Redis.from_url(url)
        # wait until both workers are adding, so the signal lands mid-run
        wait_for(lambda: inserted(client, "demo") >= 64, what="workers adding")
        client.close()
        children = child_pids(proc.pid)
        # the server runs under its watchdog (redisbuf/servers/_watchdog.py), a child of ours
        children |= {pid for child in list(children) for pid in child_pids(child)}
        assert server_pid in children and len(children) >= 4  # watchdog, server, 2 workers
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == code, err
    assert word in err and "Traceback" not in err, err
    # the server and the workers are reaped before exit; multiprocessing's resource
    # tracker leaves when its pipe closes, a moment later
    wait_for(lambda: not any(alive(pid) for pid in children), 10, f"children {children} to end")


@pytest.mark.redis_server
@pytest.mark.multiprocess
def test_demo_fails_clearly_when_the_server_goes_away(buffer_name):
    server = EmbeddedServer().start()
    try:
        proc = start_cli(
            "demo", "--url", server.url, "--name", buffer_name, "--workers", "2",
            "--batches", "1000000", "--batch-size", "16",
        )
        client = redis.Redis.from_url(server.url)
        wait_for(lambda: inserted(client, buffer_name) >= 32, what="workers adding")
        client.close()
        server.stop()
        out, err = proc.communicate(timeout=60)
    finally:
        server.stop()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, out + err
    assert_one_error_line(err, "worker", "failed", "Error")


def fails_at_once(config: DemoConfig, index: int, on_batch) -> tuple[int, int]:
    raise RuntimeError(f"boom in worker {index}")


def exits_silently(config: DemoConfig, index: int, on_batch) -> tuple[int, int]:
    os._exit(3)


@pytest.mark.redis_server
@pytest.mark.multiprocess
@pytest.mark.parametrize("work, message", [
    (fails_at_once, "RuntimeError: boom in worker"),
    (exits_silently, "exited with code 3 without reporting"),
])
def test_run_demo_reports_a_failed_worker(redis_server, buffer_name, work, message):
    config = DemoConfig(url=redis_server.url, name=buffer_name, workers=2, batches=2)
    started = time.monotonic()
    with pytest.raises(DemoError, match="worker [01] failed: " + message):
        run_demo(config, work=work)
    assert time.monotonic() - started < 60


def test_demo_settings_are_checked_before_anything_starts(capsys):
    assert cli.main(["demo", "--workers", "0"]) == 1
    captured = capsys.readouterr()
    assert_one_error_line(captured.err, "workers must be at least 1")
    assert captured.out == ""


def test_unreachable_url_is_one_clear_line_from_the_real_command():
    started = time.monotonic()
    proc = run_cli("demo", "--url", "redis://127.0.0.1:1/0", timeout=60)
    assert proc.returncode == 1, proc
    assert_one_error_line(proc.stderr, "cannot reach Redis at redis://127.0.0.1:1/0")
    assert proc.stdout == ""
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("command", [["inspect", "x"], ["worker", "--batches", "1"]])
def test_unreachable_url_is_one_clear_line(command, capsys):
    assert cli.main([*command, "--url", "redis://127.0.0.1:1/0"]) == 1
    assert_one_error_line(capsys.readouterr().err, "cannot reach Redis at redis://127.0.0.1:1/0")


@pytest.mark.redis_server
def test_manager_flag_calls_the_control_demo(monkeypatch, capsys, redis_server):
    calls = []
    module = pytest.importorskip("redisbuf.demos.manager", reason="control demo not written yet")

    def fake_run(url, name, workers, batches, console, *, capacity, batch_size):
        calls.append((url, name, workers, batches, capacity, batch_size))
        return {"workers": workers}

    monkeypatch.setattr(module, "run", fake_run)
    code = cli.main(["demo", "--manager", "--url", redis_server.url, "--workers", "3",
                     "--batches", "7", "--name", "m", "--capacity", "50", "--batch-size", "9"])
    assert code == 0
    assert calls == [(redis_server.url, "m", 3, 7, 50, 9)]


# -- worker ----------------------------------------------------------------------------


@pytest.mark.redis_server
def test_worker_adds_until_sigterm(redis_server, server_client, buffer_name):
    proc = start_cli("worker", "--url", redis_server.url, "--name", buffer_name,
                     "--batch-size", "8", "--capacity", "100", "--seed", "1")
    try:
        wait_for(lambda: inserted(server_client, buffer_name) >= 200, what="worker adding")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "worker: done" in out
    buffer = ReplayBuffer.open(server_client, buffer_name)
    stats = buffer.stats()
    assert len(buffer) == 100 and stats["inserted"] - stats["evicted"] == 100


# -- inspect ---------------------------------------------------------------------------


@pytest.fixture
def filled(redis_server, server_client, buffer_name) -> ReplayBuffer:
    buffer = ReplayBuffer(server_client, buffer_name, capacity=20)
    buffer.add({
        "obs": np.arange(50, dtype=np.float32).reshape(25, 2),
        "log_rewards": np.linspace(-3.0, 1.0, 25),
    })
    buffer.sample(5)
    return buffer


@pytest.mark.redis_server
def test_inspect_json(redis_server, filled, capsys):
    args = ["inspect", filled.name, "--url", redis_server.url, "--json", "--top", "3"]
    assert cli.main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["name"] == filled.name
    assert report["capacity"] == 20 and report["length"] == 20
    assert report["counters"] == {"inserted": 25, "evicted": 5, "sampled": 5, "last_id": 25}
    assert report["eviction"] == "fifo" and report["kind"] == "dict"
    assert report["schema"]["fields"]["obs"] == {"dtype": "float32", "shape": [2], "lib": "numpy"}
    assert [row["id"] for row in report["top"]] == [25, 24, 23]
    assert report["top"][0]["log_reward"] == pytest.approx(1.0)
    assert "obs=[48.0, 49.0]" in report["top"][0]["summary"]
    assert report["memory_bytes"] > 0
    meta_key = f"rb:{{{filled.name}}}:meta"
    assert report["keys"][meta_key]["exists"] is True
    assert report["keys"][f"rb:{{{filled.name}}}:masslog"]["exists"] is False


@pytest.mark.redis_server
def test_inspect_text_shows_state_and_keys(redis_server, filled):
    proc = run_cli("inspect", filled.name, "--url", redis_server.url, "--top", "2")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for text in ("capacity", "20 (100% full)", "fifo (oldest first)", "Schema (dict)",
                 "float32", "Top 2 by log-reward", "1.0000", f"rb:{{{filled.name}}}:items",
                 f"ZREVRANGE 'rb:{{{filled.name}}}:prio' 0 9 WITHSCORES", "memory in Redis"):
        assert text in out, out


@pytest.mark.redis_server
def test_inspect_reads_current_priorities(redis_server, server_client, buffer_name, capsys):
    buffer = ReplayBuffer(server_client, buffer_name, capacity=8,
                          sampler=PERSampler(initial_priority=2.0))
    buffer.add({"obs": np.arange(10, dtype=np.float32)})  # ids 1..10; 1 and 2 evicted
    buffer.update_priority([3, 5, 1], [0.25, 7.0, 9.0])  # id 1 no longer stored
    args = ["inspect", buffer_name, "--url", redis_server.url, "--json", "--priority",
            "3", "5", "4", "1", "99"]
    assert cli.main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["priorities"] == [
        {"id": 3, "priority": 0.25}, {"id": 5, "priority": 7.0}, {"id": 4, "priority": 2.0},
        {"id": 1, "priority": None}, {"id": 99, "priority": None}]
    # the redis-cli line it prints reads the same (FCALL_RO rb_priority, item 1 there)
    lines = redis_cli_lines(redis_server.url, buffer)
    line = next(x for x in lines if "rb_priority" in x)
    words = line.split("FCALL_RO ", 1)[1].split()
    keys = [w.strip("'") for w in words[2:-1]]
    assert int(words[1]) == len(keys)
    read = server_client.execute_command("FCALL_RO", "rb_priority", len(keys), *keys, 5)
    assert float(read[0]) == 7.0
    proc = run_cli("inspect", buffer_name, "--url", redis_server.url, "--priority", "5")
    assert proc.returncode == 0, proc.stderr
    assert "priority" in proc.stdout and "7" in proc.stdout


@pytest.mark.redis_server
def test_inspect_priority_of_a_buffer_without_per_is_one_clear_line(
        redis_server, filled, capsys):
    code = cli.main(["inspect", filled.name, "--url", redis_server.url, "--priority", "3"])
    assert code == 1
    assert_one_error_line(capsys.readouterr().err, "no PER priorities")


@pytest.mark.redis_server
def test_inspect_missing_buffer_names_those_that_exist(redis_server, real_client, filled,
                                                       capsys):
    # (real_client flushes the shared server first: the message names 20 buffers at most)
    code = cli.main(["inspect", "no-such-buffer", "--url", redis_server.url])
    assert code == 1
    err = capsys.readouterr().err
    assert_one_error_line(err, "no buffer named 'no-such-buffer'", filled.name)


def test_inspect_without_url_says_so(monkeypatch, capsys):
    monkeypatch.delenv("REDISBUF_URL", raising=False)
    assert cli.main(["inspect", "demo"]) == 1
    assert_one_error_line(capsys.readouterr().err, "needs a Redis server", "--url")


def test_url_defaults_to_the_environment(monkeypatch, capsys):
    monkeypatch.setenv("REDISBUF_URL", "redis://127.0.0.1:1/0")
    assert cli.main(["inspect", "demo"]) == 1
    assert_one_error_line(capsys.readouterr().err, "redis://127.0.0.1:1/0")


def test_parser_lists_the_subcommands():
    parser = cli.build_parser()
    choices = next(
        a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"
    ).choices
    assert {"demo", "inspect", "worker"} <= set(choices)
    for name in ("demo", "inspect", "worker"):
        assert "--url" in choices[name].format_help()


# -- docs ------------------------------------------------------------------------------


def test_docs_document_every_subcommand_and_the_two_commands():
    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text()
    for command in ("bash .ci/demo", "bash .ci/test"):
        assert command in readme
    # the command's reference lives on the operators' page; the README points there
    documented = readme + (root / "docs" / "operators.md").read_text()
    parser = cli.build_parser()
    choices = next(
        a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"
    ).choices
    for name in choices:
        assert f"redisbuf {name}" in documented, name
