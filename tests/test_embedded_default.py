"""The library's default server: no URL and no $REDISBUF_URL start one private server per
process tree, which children join and which never outlives the process that started it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import redis
from process_helpers import default_signals, wait_dead

pytestmark = [pytest.mark.redis_server, pytest.mark.multiprocess]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("REDISBUF_URL", "REDISBUF_EMBEDDED")}
    env.update(extra)
    return env


def _server_dir(pid: int) -> str:
    """The working directory of a running server (it changes to its --dir)."""
    return os.readlink(f"/proc/{pid}/cwd")


PARENT = textwrap.dedent(
    """
    import json, multiprocessing as mp, os, sys
    import numpy as np
    from redisbuf import ReplayBuffer
    from redisbuf.servers import embedded as server

    def child(queue):
        from redisbuf import ReplayBuffer
        buffer = ReplayBuffer.open(None, "nb")
        buffer.add({"x": np.arange(3), "log_rewards": np.zeros(3)})
        queue.put((os.environ["REDISBUF_URL"], len(buffer)))

    if __name__ == "__main__":
        buffer = ReplayBuffer(name="nb", capacity=100)
        buffer.add({"x": np.arange(5), "log_rewards": np.zeros(5)})
        again = ReplayBuffer(name="nb", capacity=100)   # same process: same server
        ctx = mp.get_context(sys.argv[1])
        queue = ctx.Queue()
        proc = ctx.Process(target=child, args=(queue,))
        proc.start()
        child_url, child_len = queue.get(timeout=60)
        proc.join(60)
        print(json.dumps({
            "url": os.environ["REDISBUF_URL"], "child_url": child_url, "child_len": child_len,
            "len": len(again), "pid": server._default.pid,
            "dir": server._default._tmpdir.name,
        }), flush=True)
    """
)


@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_buffer_without_url_starts_one_private_server_that_children_join(
    start_method, tmp_path
):
    script = tmp_path / "notebook.py"  # spawn needs a main module it can import
    script.write_text(PARENT)
    done = subprocess.run(
        [sys.executable, str(script), start_method],
        env=_env(), capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["child_url"] == report["url"]  # the child joined, it did not start one
    assert report["child_len"] == 8 and report["len"] == 8
    notes = [line for line in done.stderr.splitlines() if line.startswith("redisbuf:")]
    assert len(notes) == 1, done.stderr  # one line, once per process tree
    assert "private" in notes[0] and report["url"] in notes[0]
    # stopped at exit: process gone, port closed, directory removed
    assert wait_dead(report["pid"])
    assert not Path(report["dir"]).exists()
    with pytest.raises(redis.exceptions.ConnectionError):
        redis.Redis.from_url(report["url"], socket_connect_timeout=0.5, retry=None).ping()


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGHUP, signal.SIGTERM])
def test_private_server_does_not_outlive_a_killed_process(signum):
    code = (
        "import redisbuf, sys, time\n"
        "from redisbuf.servers import embedded as server\n"
        "redisbuf.connect().ping()\n"
        "print(server._default.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env=_env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, preexec_fn=default_signals,
    )
    try:
        pid = int(proc.stdout.readline())
        directory = _server_dir(pid)
        assert "redisbuf-server-" in directory and Path(directory).is_dir()
        proc.send_signal(signum)
        proc.wait(30)
        assert wait_dead(pid), f"server {pid} outlived its parent killed by {signum!r}"
        deadline = time.monotonic() + 10
        while Path(directory).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(directory).exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_forked_child_exiting_does_not_stop_the_parents_server():
    code = textwrap.dedent(
        """
        import os, sys
        import redisbuf
        client = redisbuf.connect()
        pid = os.fork()
        if pid == 0:
            sys.exit(0)          # runs the inherited atexit hooks
        os.waitpid(pid, 0)
        print(client.ping(), flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


def test_embedded_default_can_be_turned_off():
    code = "import redisbuf\nredisbuf.ReplayBuffer(name='x')\n"
    done = subprocess.run(
        [sys.executable, "-c", code], env=_env(REDISBUF_EMBEDDED="0"),
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode != 0
    assert "ServerUnavailableError" in done.stderr and "REDISBUF_URL" in done.stderr
    assert "started a private" not in done.stderr


def test_an_existing_url_is_used_and_nothing_is_started(redis_server):
    code = (
        "import os, redisbuf\nfrom redisbuf.servers import embedded as server\n"
        "redisbuf.ReplayBuffer(name='x', capacity=3)\n"
        "print(server._default is None, os.environ['REDISBUF_URL'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=_env(REDISBUF_URL=redis_server.url),
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", redis_server.url]
    assert "private" not in done.stderr


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().split(")")[-1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _descendants(pid: int) -> set[int]:
    todo, seen = [pid], set()
    while todo:
        for child in _children(todo.pop()):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGHUP])
def test_killed_demo_leaves_no_server_worker_or_directory_behind(signum):
    proc = subprocess.Popen(
        [sys.executable, "-m", "redisbuf", "demo", "--workers", "2", "--batches", "100000",
         "--batch-size", "8", "--name", "killed"],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=default_signals,
    )
    try:
        deadline = time.monotonic() + 90
        family: set[int] = set()
        while time.monotonic() < deadline:  # watchdog + server + 2 workers (+ tracker)
            family = _descendants(proc.pid)
            if len(family) >= 4 and proc.poll() is None:
                break
            time.sleep(0.2)
        assert len(family) >= 4, proc.communicate(timeout=10)
        time.sleep(1.0)  # the workers are adding
        family = _descendants(proc.pid)
        directories = [
            d for pid in family if "redisbuf-server-" in (d := _server_dir_or_empty(pid))
        ]
        assert directories
        proc.send_signal(signum)
        proc.wait(30)
        for pid in family:
            assert wait_dead(pid), Path(f"/proc/{pid}/cmdline").read_bytes()
        deadline = time.monotonic() + 10
        while any(Path(d).exists() for d in directories) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(Path(d).exists() for d in directories)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _server_dir_or_empty(pid: int) -> str:
    try:
        return _server_dir(pid)
    except OSError:
        return ""
