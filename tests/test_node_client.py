"""The Node.js client (clients/node/) against the suite's real server: its own tests, and
Node and Python sharing buffers with every value bit-exact."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
import redis

from redisbuf import PERSampler, ReplayBuffer
from redisbuf.errors import EmptyBufferError
from redisbuf.store import functions

NODE_DIR = Path(__file__).resolve().parent.parent / "clients" / "node"

pytestmark = pytest.mark.redis_server


def node_ready() -> str:
    """The node binary once clients/node's dependency is installed; skips the test (with
    the reason) when node is missing or npm cannot reach its registry."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node / npm not installed")
    if not (NODE_DIR / "node_modules" / "redis" / "package.json").is_file():
        command = "ci" if (NODE_DIR / "package-lock.json").is_file() else "install"
        done = subprocess.run(
            [npm, command, "--no-audit", "--no-fund"], cwd=NODE_DIR, capture_output=True,
            text=True, timeout=300,
        )
        if done.returncode != 0:
            pytest.skip(f"npm {command} could not install clients/node's dependency "
                        f"(registry unreachable?): {done.stderr.strip()[-300:]}")
    return node


def run_node(node: str, url: str, *tests: str, interop: Path | None = None) -> None:
    env = {**os.environ, "REDISBUF_URL": url}
    if interop is not None:
        env["REDISBUF_INTEROP"] = str(interop)
    done = subprocess.run(
        [node, "--test", *tests], cwd=NODE_DIR, env=env, capture_output=True, text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "# fail 0" in done.stdout and "# skipped 0" in done.stdout, done.stdout[-2000:]


def test_the_node_client_tests_pass(redis_server, real_client):
    node = node_ready()
    functions.install(real_client)
    run_node(node, redis_server.url, "test/client.test.mjs")


def test_node_and_python_share_buffers_bit_exact(redis_server, real_client, tmp_path):
    node = node_ready()
    rng = np.random.default_rng(7)
    # Python -> Node: transitions whose float32 bits Node must see unchanged
    obs = rng.standard_normal((12, 4)).astype(np.float32)
    obs[0, :3] = [np.float32(-0.0), np.float32(1e-45), np.float32(np.inf)]
    batch = {"obs": obs, "action": np.arange(12), "log_rewards": rng.standard_normal(12)}
    with ReplayBuffer(redis_server.url, "py2node", capacity=100) as py2node:
        ids = py2node.add(batch).ids.tolist()
        blobs = real_client.hmget(py2node.keys.items, [b"%012d" % i for i in ids])
    items = [
        {"id": i, "blob": base64.b64encode(blob).decode(), "obs": base64.b64encode(obs[k]).decode(),
         "log_reward": float(batch["log_rewards"][k])}
        for k, (i, blob) in enumerate(zip(ids, blobs, strict=True))
    ]
    (tmp_path / "py.json").write_text(json.dumps({"buffer": "py2node", "items": items}))

    # Node -> Python: Node adds while this process samples and updates PER priorities
    learner = ReplayBuffer(redis_server.url, "node2py", capacity=1000, sampler=PERSampler())
    stop, drawn, errors = threading.Event(), [], []

    def learn() -> None:
        try:
            while not stop.is_set():
                try:
                    info = learner.sample_with_info(8, replacement=True)
                except EmptyBufferError:
                    continue
                drawn.append(info.ids)
                learner.update_priority(info.ids, rng.uniform(0.1, 2.0, len(info.ids)))
        except Exception as exc:  # surfaced below
            errors.append(exc)

    thread = threading.Thread(target=learn)
    thread.start()
    try:
        run_node(node, redis_server.url, "test/interop.test.mjs", interop=tmp_path)
    finally:
        stop.set()
        thread.join()
    assert not errors, errors
    assert drawn, "Python never drew while Node added"
    added = json.loads((tmp_path / "node.json").read_text())
    assert len(added) == 320 and len(learner) == 320
    got = learner.get([row["id"] for row in added])
    for k, row in enumerate(added):
        assert got["obs"][k].tobytes() == base64.b64decode(row["obs"])
        assert got["next_obs"][k].tobytes() == base64.b64decode(row["next_obs"])
        assert int(got["action"][k]) == row["action"] and bool(got["done"][k]) == row["done"]
        assert got["reward"][k] == np.float32(row["reward"])
        assert got["log_rewards"][k] == row["log_reward"]
    assert got["obs"].dtype == np.float32 and got["reward"].dtype == np.float32
    # Node's records and schema are the bytes Python writes for the same values
    same = {
        "obs": got["obs"], "next_obs": got["next_obs"], "action": got["action"],
        "reward": got["reward"], "done": got["done"], "log_rewards": got["log_rewards"],
    }
    python_blobs, _, schema = learner.encode(same)
    stored = real_client.hmget(learner.keys.items, [b"%012d" % row["id"] for row in added])
    assert python_blobs == stored
    from redisbuf.store.containers import schema_to_json

    assert real_client.hget(learner.keys.meta, "schema").decode() == schema_to_json(schema)
    # Node's own update_priority landed (the learner may have changed them since: present)
    assert not np.isnan(learner.priorities([added[1]["id"]])).any()
    learner.close()
    with pytest.raises(redis.exceptions.ResponseError, match="RB_CONFIG"):
        keys = ReplayBuffer(real_client, "py2node", capacity=100).keys.all_keys()
        real_client.fcall("rb_update_priority", len(keys), *keys, b"%012d" % ids[0],
                          np.array([1.0], ">f8").tobytes())


def test_node_meets_a_large_add_and_stores_the_rest_of_it(redis_server, real_client,
                                                          monkeypatch):
    node = node_ready()
    from redisbuf.buffers import staged

    n = 3 * 1024 + 5
    with ReplayBuffer(redis_server.url, "node-applying", capacity=10_000) as buffer:
        def die(client, keys):  # the writer dies right after its commit
            raise SystemExit("writer gone")

        monkeypatch.setattr(staged, "_store_the_rest", die)
        with pytest.raises(SystemExit):
            buffer.add({"x": np.arange(n, dtype=np.int64), "log_rewards": np.zeros(n)})
    assert real_client.hexists(buffer.keys.meta, "applying")
    env = {"REDISBUF_APPLYING": json.dumps({"buffer": "node-applying", "length": n})}
    monkeypatch.setattr(os, "environ", {**os.environ, **env})
    run_node(node, redis_server.url, "test/applying.test.mjs")
    assert not real_client.keys("rb:{node-applying}:appl*")
