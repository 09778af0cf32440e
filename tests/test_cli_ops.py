"""Operators' commands as subprocesses against a real server: list, watch, plot,
export / import, drop, metrics; --json parsed back; user errors as one line and exit 1;
passwords never printed; inspect prints server data literally."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator

import msgpack
import numpy as np
import pytest
import redis
from cluster_helpers import per_priorities_by_field
from key_contents import key_contents
from process_helpers import default_signals
from prometheus_client.parser import text_string_to_metric_families

from redisbuf import BufferKeys, PERSampler, ReplayBuffer
from redisbuf.buffers.episodes import EpisodeBuffer
from redisbuf.buffers.sequence import SequenceBuffer
from redisbuf.buffers.sharded import ShardedReplayBuffer
from redisbuf.ops.metrics import HIST_STEP, history_rates, log_reward_histogram, parse_history
from redisbuf.servers.embedded import EmbeddedServer, free_port

pytestmark = pytest.mark.redis_server
TIMEOUT = 120
DEBIAN_SERVER = "/usr/bin/redis-server"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "REDISBUF_URL"}
    env.update({"PYTHONUNBUFFERED": "1", "COLUMNS": "200", "NO_COLOR": "1"})
    env.update(extra)
    return env


def cli(*args: str, url: str | None = None, stdin: str | None = None, **env: str):
    extra = {"REDISBUF_URL": url} if url else {}
    return subprocess.run(
        [sys.executable, "-m", "redisbuf", *args], capture_output=True, text=True,
        timeout=TIMEOUT, env=_env(**extra, **env), input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
    )


def main_in_process(capsys, *args: str, url: str | None = None):
    """``redisbuf ARGS`` run by :func:`redisbuf.cli.main` in this process (quicker than a
    subprocess, for the checks of bad input), as a CompletedProcess."""
    from redisbuf import cli as cli_package

    saved_env = os.environ.pop("REDISBUF_URL", None)
    saved_term = signal.getsignal(signal.SIGTERM)
    if url:
        os.environ["REDISBUF_URL"] = url
    capsys.readouterr()
    try:
        code = cli_package.main(list(args))
    except SystemExit as exc:  # argparse
        code = exc.code
    finally:
        signal.signal(signal.SIGTERM, saved_term)
        os.environ.pop("REDISBUF_URL", None)
        if saved_env is not None:
            os.environ["REDISBUF_URL"] = saved_env
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), code, out, err)


def one_error(done: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stdout == ""  # errors never go to stdout (a --json reader sees nothing)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def as_json(done: subprocess.CompletedProcess[str]) -> dict:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # the whole of stdout is one document


def fill(client: redis.Redis, name: str, n: int, capacity: int = 1000, **kw) -> ReplayBuffer:
    buffer = ReplayBuffer(client, name, capacity=capacity, **kw)
    if n:
        buffer.add({"x": np.arange(n, dtype=np.int64), "log_rewards": np.linspace(-3, 0, n)})
    return buffer


def dump_all(client: redis.Redis, name: str) -> dict[str, object]:
    return key_contents(client, BufferKeys(name).all_keys())


@pytest.fixture
def url(redis_server: EmbeddedServer, real_client: redis.Redis) -> str:
    return redis_server.url


# -- list ------------------------------------------------------------------------------


def test_list_shows_every_buffer_with_json(url, real_client):
    assert as_json(cli("list", "--json", url=url))["buffers"] == []
    for i in range(25):  # more than the 20 the old hint showed
        fill(real_client, f"b{i:02d}", i % 3, capacity=10 + i)
    doc = as_json(cli("list", "--json", url=url))
    rows = {row["name"]: row for row in doc["buffers"]}
    assert sorted(rows) == [f"b{i:02d}" for i in range(25)]
    assert rows["b04"]["capacity"] == 14 and rows["b04"]["length"] == 1
    assert rows["b04"]["kind"] == "dict" and rows["b04"]["memory_bytes"] > 0
    assert rows["b03"]["last_insert"] is None  # created, never added to
    assert abs(rows["b04"]["last_insert"] - time.time()) < 60
    text = cli("list", "--url", url)
    assert text.returncode == 0 and "b24" in text.stdout and "25 buffer(s)" in text.stdout
    # a missing name lists every buffer, or says how many more there are
    line = one_error(cli("inspect", "nope", url=url), "b00", "b19", "5 more")
    assert "b20" not in line


def test_every_command_needs_a_url_and_says_so_the_same_way(capsys):
    one_error(cli("list"), "needs a Redis server", "--url", "REDISBUF_URL")  # as a process
    for args in (["inspect", "x"], ["watch", "x"], ["plot", "x", "-o", "f.png"],
                 ["export", "x", "f"], ["drop", "x"], ["metrics"], ["import", "f", "x"],
                 ["manager", "x", "--workers", "1"], ["worker"]):
        if args[0] == "import":
            continue  # reads its file first: covered below
        one_error(main_in_process(capsys, *args), "needs a Redis server", "--url",
                  "REDISBUF_URL")


def test_unreachable_and_non_redis_servers_are_one_clear_line():
    one_error(cli("list", "--url", "redis://127.0.0.1:1/0"), "cannot reach Redis")
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def answer() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.recv(1024)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            conn.close()

    threading.Thread(target=answer, daemon=True).start()
    try:
        port = listener.getsockname()[1]
        one_error(cli("list", "--url", f"redis://127.0.0.1:{port}/0"),
                  "does not speak the Redis protocol")
    finally:
        listener.close()


# -- passwords -------------------------------------------------------------------------


def test_password_urls_work_and_the_password_is_never_printed():
    secret = "Pa55-word_x"
    with EmbeddedServer(extra_args=["--requirepass", secret]) as server:
        good = f"redis://default:{secret}@127.0.0.1:{server.port}/0"
        client = redis.Redis.from_url(good)
        fill(client, "locked", 5)
        for args in (["list", "--json"], ["inspect", "locked", "--json"],
                     ["watch", "locked", "--json", "--count", "1"]):
            done = cli(*args, "--url", good)
            assert done.returncode == 0, done.stderr
            assert secret not in done.stdout + done.stderr
            assert "***" in json.loads(done.stdout)["url"]
        done = cli("list", url=good)  # via $REDISBUF_URL, rich output
        assert done.returncode == 0 and secret not in done.stdout + done.stderr
        bad = f"redis://default:{secret}X@127.0.0.1:{server.port}/0"
        line = one_error(cli("list", "--url", bad))
        assert secret not in line
        line = one_error(cli("inspect", "nope", "--url", good), "locked")
        assert secret not in line
        client.close()



def _self_signed_certificate(directory) -> tuple[str, str]:
    """A certificate for 127.0.0.1 (its own CA) and its key, made with openssl."""
    cert, key = str(directory / "server.crt"), str(directory / "server.key")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", key, "-out", cert, "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )
    return cert, key


@pytest.mark.skipif(not os.path.exists(DEBIAN_SERVER), reason="needs Debian's redis-server "
                    "(built with TLS; .ci/setup installs it as root)")
def test_tls_and_password_urls_work_in_every_command(tmp_path):
    """rediss:// with a password: the same commands work and the password is never printed;
    a URL without the CA is refused with one clear line."""
    secret = "Tls-pa55_y"
    cert, key = _self_signed_certificate(tmp_path)
    tls_port = free_port()
    tls_args = ["--tls-port", str(tls_port), "--tls-cert-file", cert, "--tls-key-file", key,
                "--tls-ca-cert-file", cert, "--tls-auth-clients", "no",
                "--requirepass", secret]
    with EmbeddedServer(binary=DEBIAN_SERVER, extra_args=tls_args):
        good = f"rediss://default:{secret}@127.0.0.1:{tls_port}/0?ssl_ca_certs={cert}"
        client = redis.Redis.from_url(good)
        assert client.connection_pool.connection_class is redis.SSLConnection
        fill(client, "sealed", 5)
        for args in (["list", "--json"], ["inspect", "sealed", "--json"],
                     ["watch", "sealed", "--json", "--count", "1"]):
            done = cli(*args, "--url", good)
            assert done.returncode == 0, done.stderr
            assert secret not in done.stdout + done.stderr
            assert json.loads(done.stdout)["url"].startswith("rediss://")
        exported = tmp_path / "sealed.rbuf"
        done = cli("export", "sealed", str(exported), url=good)  # via $REDISBUF_URL
        assert done.returncode == 0 and secret not in done.stdout + done.stderr
        done = cli("import", str(exported), "copy", "--json", url=good)
        assert done.returncode == 0, done.stderr
        assert len(ReplayBuffer.open(client, "copy")) == 5
        done = cli("drop", "copy", "--yes", url=good)
        assert done.returncode == 0 and not client.exists("rb:{copy}:meta")
        untrusted = f"rediss://default:{secret}@127.0.0.1:{tls_port}/0"
        line = one_error(cli("list", "--url", untrusted))
        assert secret not in line
        client.close()


# -- inspect ---------------------------------------------------------------------------


def test_inspect_prints_field_names_literally(url, real_client):
    buffer = ReplayBuffer(real_client, "markup", capacity=10)
    buffer.add({
        "[/x]": np.arange(2), "[link=http://evil.example]y[/link]": np.zeros(2),
        "[bold]z": np.ones(2), "log_rewards": np.zeros(2),
    })
    done = cli("inspect", "markup", url=url, TERM="xterm-256color", FORCE_COLOR="1")
    assert done.returncode == 0, done.stderr
    assert "[/x]" in done.stdout
    assert "[link=http://evil.example]y[/link]" in done.stdout
    assert "[bold]z" in done.stdout
    assert "\x1b]8;" not in done.stdout  # no hyperlink escape sequence
    doc = as_json(cli("inspect", "markup", "--json", url=url))
    assert "[/x]" in doc["schema"]["fields"]


def test_inspect_shows_sequence_and_episode_buffers(url, real_client, capsys):
    seq = SequenceBuffer(real_client, "seqbuf", num_environments=2, max_length=3)
    for _ in range(4):
        seq.add_batch({"obs": np.arange(2, dtype=np.float32)})  # 8 steps into 2 x 3
    seq.get_batch(2, 2)  # 4 steps sampled
    doc = as_json(cli("inspect", "seqbuf", "--json", url=url))
    assert (doc["buffer_class"], doc["unit"], doc["length"], doc["capacity"]) == (
        "sequence", "steps", 6, 6)
    assert doc["counters"] == {"inserted": 8, "evicted": 2, "sampled": 4}
    assert doc["configuration"]["num_environments"] == 2
    assert doc["configuration"]["max_length"] == 3
    assert doc["memory_bytes"] > 0
    assert doc["keys"]["rb:{seqbuf}:seq:steps"]["exists"]
    assert "top" not in doc and "prioritized_sampling_ready" not in doc
    text = cli("inspect", "seqbuf", url=url)
    assert text.returncode == 0, text.stderr
    for needle in ("Sequence buffer 'seqbuf'", "6 steps (100% full)", "inserted (added)",
                   "8 steps", "max_length", "rb:{seqbuf}:seq:envs", "obs", "float32",
                   "HGETALL 'rb:{seqbuf}:seq:meta'"):
        assert needle in text.stdout, (needle, text.stdout)
    assert "by log-reward" not in text.stdout and "sum tree built" not in text.stdout

    episodes = EpisodeBuffer(real_client, "epbuf", capacity_episodes=2)
    for length in (1, 2, 3):
        episodes.push([{"o": float(t)} for t in range(length)])
    doc = as_json(cli("inspect", "epbuf", "--json", url=url))
    assert (doc["buffer_class"], doc["unit"], doc["length"], doc["capacity"]) == (
        "episodes", "episodes", 2, 2)
    assert doc["counters"] == {"inserted": 3, "evicted": 1, "sampled": 0, "steps": 5,
                               "last_id": 3}
    assert doc["configuration"] == {"capacity_episodes": 2}
    text = cli("inspect", "epbuf", url=url)
    assert text.returncode == 0, text.stderr
    for needle in ("Episodes buffer 'epbuf'", "2 episodes (100% full)", "inserted (pushed)",
                   "rb:{epbuf}:episodes:lens", "fifo (oldest episodes first)"):
        assert needle in text.stdout, (needle, text.stdout)

    # a ReplayBuffer under the sequence buffer's name: --class picks, as in watch / plot
    fill(real_client, "seqbuf", 3)
    one_error(main_in_process(capsys, "inspect", "seqbuf", url=url),
              "classes buffer, sequence", "--class")
    doc = as_json(cli("inspect", "seqbuf", "--class", "buffer", "--json", url=url))
    assert (doc["buffer_class"], doc["unit"], doc["length"]) == ("buffer", "items", 3)
    assert len(doc["top"]) == 3
    doc = as_json(cli("inspect", "seqbuf", "--class", "sequence", "--json", url=url))
    assert (doc["buffer_class"], doc["length"]) == ("sequence", 6)
    one_error(main_in_process(capsys, "inspect", "epbuf", "--class", "fragments", url=url),
              "no fragments buffer named 'epbuf'", "episodes")
    one_error(main_in_process(capsys, "inspect", "nope", url=url),
              "no buffer named 'nope'", "epbuf (episodes)", "seqbuf (sequence)")


def test_json_errors_leave_stdout_empty(url, capsys):
    one_error(cli("inspect", "nope", "--json", url=url), "no buffer named 'nope'")
    for command in ("inspect", "watch", "drop"):
        one_error(main_in_process(capsys, command, "bad name!", "--json", url=url),
                  "invalid buffer name")


# -- drop ------------------------------------------------------------------------------


def test_drop_asks_unless_yes(url, real_client):
    fill(real_client, "victim", 4)
    before = dump_all(real_client, "victim")
    one_error(cli("drop", "victim", url=url), "--yes", "4 items")
    assert dump_all(real_client, "victim") == before
    done = cli("drop", "victim", url=url, stdin="n\n")  # not a terminal: still refused
    assert done.returncode == 1 and dump_all(real_client, "victim") == before
    doc = as_json(cli("drop", "victim", "--yes", "--json", url=url))
    assert doc == {"url": url, "dropped": "victim", "items": 4}
    assert not real_client.exists(*BufferKeys("victim").all_keys())
    one_error(cli("drop", "victim", "--yes", url=url), "no buffer named 'victim'")


def test_drop_at_a_terminal_asks(url, real_client):
    fill(real_client, "asked", 2)
    for answer, survives in ((b"n\n", True), (b"y\n", False)):
        pid, fd = pty.fork()
        if pid == 0:  # pragma: no cover - the child
            os.environ.update(_env(REDISBUF_URL=url))
            os.execv(sys.executable, [sys.executable, "-m", "redisbuf", "drop", "asked"])
        output = _read_until(fd, b"[y/N]")
        os.write(fd, answer)
        _read_until(fd, b"")
        _, status = os.waitpid(pid, 0)
        assert b"Delete buffer 'asked'" in output
        assert os.waitstatus_to_exitcode(status) == (1 if survives else 0)
        assert bool(real_client.exists("rb:{asked}:meta")) == survives


def _read_until(fd: int, marker: bytes, timeout: float = 60) -> bytes:
    data = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                return data
            if not chunk:
                return data
            data += chunk
            if marker and marker in data:
                return data
    return data


# -- export / import -------------------------------------------------------------------


def test_export_import_moves_a_buffer_between_servers(url, real_client, tmp_path):
    fill(real_client, "src", 300, capacity=500, prioritized_capacity=True)
    path = tmp_path / "src.rbuf"
    done = cli("export", "src", str(path), url=url)
    assert done.returncode == 0, done.stderr
    assert "300/300" in done.stderr  # the progress bar (on stderr)
    assert "Exported 300 items" in done.stdout
    doc = as_json(cli("export", "src", str(path), "--json", url=url))
    assert doc["items"] == 300 and doc["bytes"] == path.stat().st_size
    with EmbeddedServer() as other:
        shown = cli("import", str(path), "shown", "--url", other.url)
        assert shown.returncode == 0, shown.stderr
        assert "300/300" in shown.stderr  # the progress bar (on stderr)
        doc = as_json(cli("import", str(path), "dst", "--json", "--url", other.url))
        assert doc["items"] == 300 and doc["created"] is True
        copy = ReplayBuffer.open(other.url, "dst")
        original = ReplayBuffer.open(real_client, "src")
        assert copy.capacity == 500 and copy.prioritized_capacity
        assert len(copy) == 300
        top_copy, top_original = copy.top(300), original.top(300)
        assert sorted(s for _, s in top_copy) == sorted(s for _, s in top_original)
        assert sorted(copy.get([i for i, _ in top_copy])["x"].tolist()) == list(range(300))
        copy.client.close()
        # into an existing non-empty buffer: asks, then replaces with --yes
        one_error(cli("import", str(path), "dst", "--url", other.url), "--yes", "300 items")
        doc = as_json(cli("import", str(path), "dst", "--yes", "--json", "--url", other.url))
        assert doc["created"] is False and doc["length"] == 300


def test_export_import_keep_per_priorities_and_use_counts(url, real_client, tmp_path):
    from redisbuf import PERSampler

    sampler = PERSampler(alpha=0.7, eps=0.01, initial_priority=2.0)
    src = fill(real_client, "per-src", 20, capacity=50, sampler=sampler)
    ids = [int(m) for m in real_client.zrange(src.keys.order, 0, -1)]
    src.update_priority(ids, np.arange(20) / 4)
    src.sample(30)
    path = tmp_path / "per.rbuf"
    done = cli("export", "per-src", str(path), url=url)
    assert done.returncode == 0, done.stderr
    assert "per item: log-reward, use count, PER priority" in done.stdout

    def in_order(client, name):
        keys = BufferKeys(name)
        members = client.zrange(keys.order, 0, -1)
        per = [None if v is None else float(v) for v in client.hmget(keys.per, members)]
        return per, [int(u or 0) for u in client.hmget(keys.uses, members)]

    with EmbeddedServer() as other:
        done = cli("import", str(path), "dst", "--url", other.url)
        assert done.returncode == 0, done.stderr
        assert "per item: log-reward, use count, PER priority" in done.stdout
        client = redis.Redis.from_url(other.url)
        meta = client.hgetall(BufferKeys("dst").meta)
        assert meta[b"mass"] == b"per"  # created with the saved PER settings
        assert (meta[b"per_alpha"], meta[b"per_eps"], meta[b"per_initial"]) == (
            b"0.7", b"0.01", b"2.0")
        assert in_order(client, "dst") == in_order(real_client, "per-src")
        assert sum(in_order(client, "dst")[1]) == 30
        # an existing target without PER: refused unchanged, or told to drop them
        fill(client, "plain", 1, capacity=50)
        before = dump_all(client, "plain")
        one_error(cli("import", str(path), "plain", "--yes", "--url", other.url),
                  "PER", "--drop-per-priorities")
        assert dump_all(client, "plain") == before
        doc = as_json(cli("import", str(path), "plain", "--yes", "--drop-per-priorities",
                          "--json", "--url", other.url))
        assert doc["length"] == 20 and doc["per_priorities"] is False
        per, uses = in_order(client, "plain")
        assert per == [None] * 20 and sum(uses) == 30
        client.close()


def test_export_import_move_a_sharded_buffer_whole(url, real_client, tmp_path, capsys):
    sharded = ShardedReplayBuffer(real_client, "sh", capacity=30, shards=3, seed=1)
    for start in range(0, 12, 4):
        sharded.add({"x": np.arange(start, start + 4), "log_rewards": np.zeros(4)})
    path = tmp_path / "sh.rbuf"
    doc = json.loads(main_in_process(capsys, "export", "sh", str(path), "--json", url=url).stdout)
    assert doc["items"] == 12 and doc["shards"] == 3
    # a missing target: created sharded, every shard with its saved items
    doc = json.loads(main_in_process(capsys, "import", str(path), "copy", "--json", url=url).stdout)
    assert doc["created"] is True and doc["shards"] == 3 and doc["length"] == 12
    copy = ShardedReplayBuffer.open(real_client, "copy")
    assert copy.capacity == 30
    assert [len(s) for s in copy.shards] == [len(s) for s in sharded.shards]
    # an existing sharded target: asks, then replaces with --yes
    done = main_in_process(capsys, "import", str(path), "copy", url=url)
    assert done.returncode == 1 and "--yes" in done.stderr
    done = main_in_process(capsys, "import", str(path), "copy", "--yes", url=url)
    assert done.returncode == 0 and len(copy) == 12
    # a plain target takes the sharded file; a sharded target a plain file
    fill(real_client, "flat", 0, capacity=40)
    done = main_in_process(capsys, "import", str(path), "flat", url=url)
    assert done.returncode == 0 and len(ReplayBuffer.open(real_client, "flat")) == 12
    main_in_process(capsys, "export", "flat", str(tmp_path / "flat.rbuf"), url=url)
    done = main_in_process(capsys, "import", str(tmp_path / "flat.rbuf"), "copy", "--yes",
                           url=url)
    assert done.returncode == 0 and [len(s) for s in copy.shards] == [4, 4, 4]
    # a refused import into a missing target leaves nothing behind
    small = tmp_path / "small.rbuf"
    data = path.read_bytes()
    small.write_bytes(data[:-3])  # truncated
    done = main_in_process(capsys, "import", str(small), "gone", url=url)
    assert done.returncode == 1 and "truncated" in done.stderr
    assert not real_client.keys("rb:{gone*")


def test_export_import_move_a_sharded_per_buffer_with_its_priorities(url, real_client, tmp_path,
                                                                      capsys):
    sharded = ShardedReplayBuffer(real_client, "shper", capacity=30, shards=3, seed=1,
                                  sampler=PERSampler(alpha=0.7, eps=0.01))
    for start in range(0, 12, 4):
        sharded.add({"x": np.arange(start, start + 4), "log_rewards": np.zeros(4)},
                    priorities=np.arange(start, start + 4) + 0.5)
    path = tmp_path / "shper.rbuf"
    doc = json.loads(main_in_process(capsys, "export", "shper", str(path), "--json",
                                     url=url).stdout)
    assert doc["per_priorities"] is True and doc["shards"] == 3
    doc = json.loads(main_in_process(capsys, "import", str(path), "shper2", "--json",
                                     url=url).stdout)
    assert doc["created"] is True and doc["length"] == 12

    def by_x(buffer: ShardedReplayBuffer) -> dict[float, float]:
        return per_priorities_by_field(real_client, buffer.shards, "x")

    copy = ShardedReplayBuffer.open(real_client, "shper2", sampler=PERSampler(alpha=0.7,
                                                                              eps=0.01))
    assert by_x(copy) == {float(x): x + 0.5 for x in range(12)} == by_x(sharded)
    assert real_client.hget(copy.shards[0].keys.meta, "per_alpha") == b"0.7"


def test_import_refuses_newer_format_and_mismatched_schema_leaving_target_unchanged(
    url, real_client, tmp_path
):
    fill(real_client, "src", 10)
    path = tmp_path / "src.rbuf"
    assert cli("export", "src", str(path), url=url).returncode == 0
    # a newer format: nothing created
    newer = tmp_path / "newer.rbuf"
    unpacker = msgpack.Unpacker(open(path, "rb"), raw=False)
    header, *rest = list(unpacker)
    with open(newer, "wb") as handle:
        handle.write(msgpack.packb({**header, "version": 99}, use_bin_type=True))
        for entry in rest:
            handle.write(msgpack.packb(entry, use_bin_type=True))
    one_error(cli("import", str(newer), "fresh", url=url), "newer")
    assert not real_client.exists("rb:{fresh}:meta")
    # a schema that does not fit an existing (empty or not) buffer: byte-identical after
    other = ReplayBuffer(real_client, "other", capacity=100)
    other.add({"y": np.zeros((2, 3)), "log_rewards": np.zeros(2)})
    before = dump_all(real_client, "other")
    one_error(cli("import", str(path), "other", "--yes", url=url), "schema")
    assert dump_all(real_client, "other") == before
    # too many items for the target's capacity
    fill(real_client, "small", 0, capacity=5)
    before = dump_all(real_client, "small")
    one_error(cli("import", str(path), "small", url=url), "capacity")
    assert dump_all(real_client, "small") == before
    # a truncated file: refused, and a target created for it is removed again
    truncated = tmp_path / "cut.rbuf"
    truncated.write_bytes(path.read_bytes()[:-40])
    one_error(cli("import", str(truncated), "fresh2", url=url))
    assert not real_client.exists("rb:{fresh2}:meta")
    one_error(cli("import", str(tmp_path / "missing.rbuf"), "x", url=url), "no file")


# -- watch -----------------------------------------------------------------------------

WRITER = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from redisbuf import BufferKeys, ReplayBuffer
    buffer = ReplayBuffer(sys.argv[1], sys.argv[2], capacity=200, seed=int(sys.argv[3]))
    rng = np.random.default_rng(int(sys.argv[3]))
    while True:
        buffer.add({"x": rng.integers(0, 9, 16), "log_rewards": rng.normal(size=16)})
        buffer.sample(8)
        time.sleep(0.01)
    """
)


@pytest.fixture
def writers(url, real_client) -> Iterator[list[subprocess.Popen]]:
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, url, "live", str(i)], env=_env(),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for i in range(3)
    ]
    deadline = time.monotonic() + 60
    while int(real_client.hget("rb:{live}:meta", "inserted") or 0) < 200:
        assert time.monotonic() < deadline, [p.poll() for p in procs]
        time.sleep(0.1)
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.mark.multiprocess
def test_watch_json_reports_rates_while_many_processes_write(url, writers):
    doc = as_json(cli("watch", "live", "--json", "--count", "3", "--interval", "0.5", url=url))
    frames = doc["frames"]
    assert len(frames) == 3 and frames[0]["rates"] is None
    for frame in frames[1:]:
        assert frame["rates"]["inserted_per_s"] > 0
        assert frame["rates"]["sampled_per_s"] > 0
        assert frame["rates"]["evicted_per_s"] > 0  # capacity 200 is full
        assert frame["length"] == frame["capacity"] == 200
        assert sum(frame["histogram"]["counts"]) == 200
        assert len(frame["top"]) == 5
    assert frames[2]["inserted"] > frames[0]["inserted"]


@pytest.mark.multiprocess
def test_watch_live_view_quits_on_q_and_on_ctrl_c(url, writers):
    for stop in (b"q", signal.SIGINT):
        pid, fd = pty.fork()
        if pid == 0:  # pragma: no cover - the child
            default_signals()  # the SIGINT below must not meet an inherited ignore
            os.environ.update(_env(REDISBUF_URL=url, COLUMNS="120", LINES="60"))
            os.execv(sys.executable, [sys.executable, "-m", "redisbuf", "watch", "live",
                                      "--interval", "0.3"])
        output = _read_until(fd, b"inserted/s")
        assert b"inserted/s" in output and b"length / capacity" in output, output[-2000:]
        if isinstance(stop, bytes):
            os.write(fd, stop)
        else:
            os.kill(pid, stop)
        _read_until(fd, b"", timeout=20)
        deadline = time.monotonic() + 20
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        if done[0] == 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"redisbuf watch did not exit on {stop!r}: {output[-2000:]!r}")
        assert os.waitstatus_to_exitcode(done[1]) == 0, output[-2000:]


def test_watch_bad_input(url, real_client, capsys):
    one_error(main_in_process(capsys, "watch", "nope", url=url), "no buffer named 'nope'")
    fill(real_client, "w", 1)
    one_error(main_in_process(capsys, "watch", "w", "--interval", "0", url=url), "--interval")
    one_error(main_in_process(capsys, "watch", "w", "--count", "0", url=url), "--count")


# -- rate history and plot -------------------------------------------------------------


def test_add_keeps_a_rate_history_in_meta(url, real_client):
    buffer = fill(real_client, "hist", 5)
    buffer.sample(3)
    buffer.add({"x": np.arange(2), "log_rewards": np.zeros(2)})
    now = int(real_client.time()[0])
    meta = {k.decode(): v.decode() for k, v in real_client.hgetall("rb:{hist}:meta").items()}
    points = parse_history(meta)
    assert len(points) == 1
    assert points[0].t == (now // HIST_STEP) * HIST_STEP or points[0].t == (
        (now - 1) // HIST_STEP
    ) * HIST_STEP
    assert (points[0].inserted, points[0].evicted, points[0].sampled) == (7, 0, 3)
    assert abs(float(meta["last_insert"]) - now) <= 2
    # the sampling scripts write no history
    fields = set(meta)
    buffer.sample(2)
    after = {k.decode() for k in real_client.hgetall("rb:{hist}:meta")}
    assert after == fields


def test_history_rates_from_buckets():
    meta = {
        "hist:1": f"{100} 10 0 5", "hist:2": f"{101} 30 5 25", "hist:4": f"{103} 50 25 25",
        "hist:9": "garbage", "capacity": "4",
    }
    rates = history_rates(parse_history(meta))
    assert [(r.inserted, r.evicted, r.sampled) for r in rates] == [
        (2.0, 0.5, 2.0), (1.0, 1.0, 0.0)
    ]
    # a clear() restarts the counters: count from zero, never negative
    meta["hist:5"] = "104 4 0 1"
    assert history_rates(parse_history(meta))[-1].inserted == 0.4


def test_plot_writes_an_image_and_json(url, real_client, tmp_path):
    buffer = fill(real_client, "plotted", 50)
    buffer.add({"x": np.arange(3), "log_rewards": np.full(3, -np.inf)})
    # two earlier buckets, as add would have written them a minute ago
    bucket = int(real_client.time()[0]) // HIST_STEP
    real_client.hset("rb:{plotted}:meta", mapping={
        f"hist:{(bucket - 6) % 360}": f"{bucket - 6} 10 0 0",
        f"hist:{(bucket - 3) % 360}": f"{bucket - 3} 40 0 30",
    })
    out = tmp_path / "p.png"
    doc = as_json(cli("plot", "plotted", "-o", str(out), "--json", "--bins", "10", url=url))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sum(doc["histogram"]["counts"]) == 50 and doc["histogram"]["minus_inf"] == 3
    assert len(doc["rates"]) == 2
    assert doc["rates"][0]["inserted_per_s"] == pytest.approx(1.0)
    assert doc["rates"][0]["sampled_per_s"] == pytest.approx(1.0)
    done = cli("plot", "plotted", "-o", str(tmp_path / "p.svg"), url=url)
    assert done.returncode == 0 and (tmp_path / "p.svg").read_text().lstrip().startswith("<?xml")

def test_a_single_log_reward_makes_one_bar_centred_on_it(real_client):
    buffer = fill(real_client, "flat", 0, capacity=5)
    buffer.add({"x": np.arange(8), "log_rewards": np.full(8, -2.5)})  # full: 5 kept
    hist = log_reward_histogram(real_client, "flat", 40)
    assert sum(hist.counts) == 5
    assert (hist.edges[0] + hist.edges[-1]) / 2 == pytest.approx(-2.5)
    assert hist.edges[-1] > hist.edges[0]


def test_plot_figure_reads_clock_time_and_shows_rates_that_coincide():
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import dates as mdates
    from matplotlib import pyplot as plt

    from redisbuf.cli.plot import draw
    from redisbuf.ops.metrics import Histogram, Rate

    t0 = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC
    # a full buffer: every insert evicts one item, so the two rates are equal
    rates = [Rate(t0 + 10 * i, 3.0, 3.0, 1.0) for i in range(1, 5)]
    hist = Histogram([-3.0, -2.0], [5], 0)
    figure = draw(plt, "buffer flat", hist, "", rates, "items")
    try:
        top, bottom = figure.axes
        # clock time: the axis holds matplotlib dates of the buckets, not minutes from 0
        low, high = (mdates.num2date(x).timestamp() for x in bottom.get_xlim())
        assert low <= t0 + 10 and high >= t0 + 40 and high - low < 3600
        assert isinstance(bottom.xaxis.get_major_formatter(), mdates.DateFormatter)
        lines = {line.get_label(): line for line in bottom.get_lines()}
        assert set(lines) == {"inserted/s", "sampled/s", "evicted/s"}
        styles = {(line.get_linestyle(), line.get_marker()) for line in lines.values()}
        assert len(styles) == 3  # each line its own style: equal rates stay visible
        legend = [text.get_text() for text in bottom.get_legend().get_texts()]
        assert sorted(legend) == sorted(lines)
        # the bar of the histogram is centred in the axis
        (bar,) = top.patches
        centre = bar.get_x() + bar.get_width() / 2
        left, right = top.get_xlim()
        assert centre - left == pytest.approx(right - centre)
    finally:
        plt.close(figure)


def test_plot_bad_input(url, real_client, tmp_path, capsys):
    fill(real_client, "plotted", 5)
    out = tmp_path / "p.png"
    one_error(main_in_process(capsys, "plot", "plotted", "-o", str(tmp_path / "p.nope"),
                              url=url), "cannot write")
    one_error(main_in_process(capsys, "plot", "plotted", "-o", "/no/such/dir/p.png", url=url),
              "does not exist")
    one_error(main_in_process(capsys, "plot", "nope", "-o", str(out), url=url),
              "no buffer named")


def test_plot_and_watch_show_the_history_of_other_buffer_classes(url, real_client, tmp_path,
                                                                  capsys):
    seq = SequenceBuffer(real_client, "other", num_environments=2, max_length=3)
    for _ in range(4):
        seq.add_batch({"x": np.arange(2)})  # 8 steps into 2 x 3: 2 evicted
    seq.get_batch(2, 2)  # 4 steps sampled
    seq.add_batch({"x": np.arange(2)})
    bucket = int(real_client.time()[0]) // HIST_STEP
    out = tmp_path / "seq.png"
    doc = as_json(cli("plot", "other", "-o", str(out), "--json", url=url))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (doc["buffer_class"], doc["unit"]) == ("sequence", "steps")
    assert doc["history"], "a sequence buffer's inserts write the rate history"
    last = doc["history"][-1]
    assert (last["inserted"], last["evicted"], last["sampled"]) == (10, 4, 4)
    assert last["t"] in (bucket * HIST_STEP, (bucket - 1) * HIST_STEP)
    assert doc["histogram"]["counts"] == []  # no log-rewards in a sequence buffer
    watched = as_json(cli("watch", "other", "--json", "--interval", "0.1", url=url))
    first, second = watched["frames"]
    assert (first["buffer_class"], first["length"], first["capacity"]) == ("sequence", 6, 6)
    assert (first["inserted"], first["evicted"], first["sampled"]) == (10, 4, 4)
    assert first["rates"] is None and second["rates"]["inserted_per_s"] == 0.0
    # an episode buffer under the same name: ambiguous until --class picks one
    EpisodeBuffer(real_client, "other", capacity_episodes=2).push([1, 2, 3])
    one_error(main_in_process(capsys, "plot", "other", "-o", str(out), url=url),
              "classes sequence, episodes", "--class")
    doc = as_json(cli("plot", "other", "-o", str(out), "--class", "episodes", "--json",
                      url=url))
    assert (doc["buffer_class"], doc["unit"]) == ("episodes", "episodes")
    assert [(p["inserted"], p["evicted"], p["sampled"]) for p in doc["history"]] == [(1, 0, 0)]
    one_error(main_in_process(capsys, "watch", "other", "--class", "fragments", url=url),
              "no fragments buffer named 'other'")
    one_error(main_in_process(capsys, "plot", "nope", "-o", str(out), url=url),
              "no buffer named 'nope'", "other (sequence), other (episodes)")
    rows = as_json(cli("list", "--json", url=url))["buffers"]
    assert [(r["name"], r["buffer_class"], r["unit"], r["length"], r["capacity"])
            for r in rows] == [("other", "sequence", "steps", 6, 6),
                               ("other", "episodes", "episodes", 1, 2)]
    text = cli("list", url=url)
    assert text.returncode == 0 and "6 / 6 steps" in text.stdout, text.stdout



# -- metrics ---------------------------------------------------------------------------


def _scrape(port: int) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, sample.labels.get("buffer", ""))] = sample.value
    return values


def _start_metrics(url: str, *names: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "redisbuf", "metrics", "--port", "0", "--addr", "127.0.0.1",
         "--json", *names],
        env=_env(REDISBUF_URL=url), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=default_signals,  # the test stops it with SIGINT
    )
    lines = []
    while True:  # one JSON document, printed when listening
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        lines.append(line)
        if line.startswith("}"):
            return proc, json.loads("".join(lines))["port"]


def test_metrics_exporter_scraped_over_loopback(url, real_client):
    a = fill(real_client, "ma", 30, capacity=20)
    a.sample(7)
    fill(real_client, "mb", 3)
    real_client.hset("rb:{mb}:meta", "baseline_ema", "-1.5")
    proc, port = _start_metrics(url)
    try:
        values = _scrape(port)
        assert values[("redisbuf_up", "")] == 1
        assert values[("redisbuf_length", "ma")] == 20
        assert values[("redisbuf_capacity", "ma")] == 20
        assert values[("redisbuf_inserted_total", "ma")] == 30
        assert values[("redisbuf_evicted_total", "ma")] == 10
        assert values[("redisbuf_sampled_total", "ma")] == 7
        assert values[("redisbuf_memory_bytes", "ma")] > 0
        assert values[("redisbuf_baseline_log_reward", "mb")] == -1.5
        assert ("redisbuf_baseline_log_reward", "ma") not in values
        a.add({"x": np.arange(5), "log_rewards": np.zeros(5)})
        assert _scrape(port)[("redisbuf_inserted_total", "ma")] == 35  # read at each scrape
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    proc, port = _start_metrics(url, "mb")
    try:
        values = _scrape(port)
        assert {b for (_, b) in values if b} == {"mb"}
    finally:
        proc.terminate()
        proc.wait(30)


def _scrape_classes(port: int) -> dict[tuple[str, str, str], float]:
    """(metric, buffer label, class label) -> value; no two series may share a key."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, sample.labels.get("buffer", ""), sample.labels.get("class", ""))
            assert key not in values, f"two series {key}"
            values[key] = sample.value
    return values


def test_metrics_exports_every_class_under_one_name(url, real_client):
    fill(real_client, "clash", 5, capacity=4).sample(3)
    seq = SequenceBuffer(real_client, "clash", num_environments=2, max_length=3)
    for _ in range(4):
        seq.add_batch({"x": np.arange(2)})
    seq.get_batch(2, 2)
    EpisodeBuffer(real_client, "clash", capacity_episodes=5).push([1, 2, 3])
    EpisodeBuffer(real_client, "eps", capacity_episodes=3).push([1])
    proc, port = _start_metrics(url)
    try:
        values = _scrape_classes(port)
        expected = {  # (length, capacity, inserted, evicted, sampled) in the class's unit
            ("clash", "buffer"): (4, 4, 5, 1, 3),
            ("clash", "sequence"): (6, 6, 8, 2, 4),
            ("clash", "episodes"): (1, 5, 1, 0, 0),
            ("eps", "episodes"): (1, 3, 1, 0, 0),
        }
        for (name, buffer_class), numbers in expected.items():
            got = tuple(
                values[(f"redisbuf_{m}", name, buffer_class)]
                for m in ("length", "capacity", "inserted_total", "evicted_total",
                          "sampled_total")
            )
            assert got == numbers, (name, buffer_class)
            assert values[("redisbuf_memory_bytes", name, buffer_class)] > 0
        assert {(b, c) for (_, b, c) in values if b} == set(expected)
        # the old series keep their names and buffer label; class="buffer" is added
        assert _scrape(port)[("redisbuf_inserted_total", "eps")] == 1
        seq.add_batch({"x": np.arange(2)})
        assert _scrape_classes(port)[("redisbuf_inserted_total", "clash", "sequence")] == 10
    finally:
        proc.terminate()
        proc.wait(30)
    proc, port = _start_metrics(url, "eps")
    try:
        assert {(b, c) for (_, b, c) in _scrape_classes(port) if b} == {("eps", "episodes")}
    finally:
        proc.terminate()
        proc.wait(30)


def test_metrics_bad_input(url, capsys):
    one_error(main_in_process(capsys, "metrics", "bad name!", url=url), "invalid buffer name")
    one_error(main_in_process(capsys, "metrics", "--port", "70000", url=url), "--port")


# -- the fixes a new user asked for ----------------------------------------------------


@pytest.mark.multiprocess
def test_worker_adopts_an_existing_buffers_capacity(url, real_client):
    fill(real_client, "adopt", 0, capacity=123, prioritized_capacity=True)
    doc = as_json(cli("worker", "--name", "adopt", "--batches", "2", "--batch-size", "8",
                      "--json", url=url))
    assert doc["added"] == 16 and doc["sampled"] > 0
    stats = ReplayBuffer.open(real_client, "adopt").stats()
    assert stats["capacity"] == 123 and stats["eviction"] == "reward"
    assert stats["inserted"] == 16
    one_error(cli("worker", "--name", "adopt", "--batches", "1", "--capacity", "5", url=url),
              "capacity")


def test_demo_refuses_before_starting_anything(url, real_client, tmp_path):
    one_error(cli("demo", "--batches", "0", TMPDIR=str(tmp_path)), "--batches")
    assert list(tmp_path.iterdir()) == []  # no embedded server directory was made


def test_demo_manager_refuses_options_it_would_ignore(url, capsys):
    one_error(main_in_process(capsys, "demo", "--manager", "--prioritized", url=url),
              "--prioritized")
    one_error(main_in_process(capsys, "demo", "--manager", "--sample-size", "3", url=url),
              "--sample-size")


def test_demo_refuses_to_delete_an_existing_buffer(url, real_client):
    fill(real_client, "keep", 3)
    before = dump_all(real_client, "keep")
    one_error(cli("demo", "--name", "keep", "--workers", "1", "--batches", "1", url=url),
              "--yes", "already exists")
    assert dump_all(real_client, "keep") == before


@pytest.mark.multiprocess
def test_demo_manager_takes_capacity_and_batch_size(url, real_client):
    doc = as_json(cli("demo", "--manager", "--name", "mgr", "--workers", "1", "--batches",
                      "3", "--batch-size", "5", "--capacity", "7", "--json", url=url))
    assert doc["capacity"] == 7 and doc["round_trips"] == 3
    stats = ReplayBuffer.open(real_client, "mgr").stats()
    assert stats["capacity"] == 7
    assert stats["inserted"] == 15


def test_worker_manager_says_what_it_waits_for(url):
    proc = subprocess.Popen(
        [sys.executable, "-m", "redisbuf", "worker", "--manager", "--name", "nomgr"],
        env=_env(REDISBUF_URL=url), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        line = proc.stdout.readline()
        assert "waiting up to 60 s" in line and "redisbuf manager nomgr" in line
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_worker_waiting_for_its_manager_stops_at_once_on_sigterm_and_ctrl_c(url, signum, code):
    proc = subprocess.Popen(
        [sys.executable, "-m", "redisbuf", "worker", "--manager", "--name", "nomgr_sig"],
        env=_env(REDISBUF_URL=url), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=default_signals,
    )
    try:
        assert "waiting up to 60 s" in proc.stdout.readline()  # now in the wait
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=5)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == code, (out, err)
    assert "adding to buffer" not in out  # the buffer never existed
    assert ("terminated" if signum == signal.SIGTERM else "interrupted") in err


@pytest.mark.multiprocess
def test_demo_json_on_the_embedded_server():
    done = cli("demo", "--workers", "1", "--batches", "2", "--batch-size", "8", "--json")
    doc = as_json(done)  # stdout is the one document; the rest went to stderr
    assert doc["embedded"] is True and doc["stats"]["inserted"] == 16
    assert doc["added"] == 16 and len(doc["top"]) == 5
    assert "Embedded Redis" in done.stderr
