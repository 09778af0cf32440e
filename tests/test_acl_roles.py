"""Per-buffer ACL roles (redisbuf/ops/acl.py, ``redisbuf acl``) on a real server: each role does
its job; what it may not do is refused with NoPermissionError and changes no key."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import redis

from redisbuf import PERSampler, ReplayBuffer, cli
from redisbuf.ops import acl
from redisbuf.store import functions
from redisbuf.store.keys import BufferKeys

pytestmark = pytest.mark.redis_server


def _snapshot(client: redis.Redis) -> dict[bytes, object]:
    out: dict[bytes, object] = {}
    for key in sorted(client.scan_iter(match="rb:*")):
        out[key] = client.dump(key)
    return out


@pytest.fixture
def setup(redis_server, real_client, tmp_path):
    functions.install(real_client)
    name, other = f"acl-{uuid.uuid4().hex[:6]}", f"other-{uuid.uuid4().hex[:6]}"
    buffer = ReplayBuffer(real_client, name, capacity=16, sampler=PERSampler())
    buffer.add({"x": np.arange(8, dtype=np.float32).reshape(4, 2), "log_rewards": np.zeros(4)})
    ReplayBuffer(real_client, other, capacity=16).add({"y": np.zeros((2, 1))})
    secret = tmp_path / "pw"
    secret.write_text("s3cret-pw\n")
    users = []

    def user(role: str) -> redis.Redis:
        username = f"{role}-{uuid.uuid4().hex[:6]}"
        users.append(username)
        argv = ["acl", name, "--role", role, "--user", username, "--apply",
                "--url", redis_server.url, "--password-file", str(secret)]
        assert cli.main(argv) == 0
        return redis.Redis(host="127.0.0.1", port=redis_server.port, username=username,
                           password="s3cret-pw")

    yield name, other, buffer, user
    for username in users:
        real_client.execute_command("ACL", "DELUSER", username)


def _fcall(client, function, name, *args, read_only=False):
    keys = BufferKeys(name).all_keys()
    call = client.fcall_ro if read_only else client.fcall
    return call(function, len(keys), *keys, *args)


def _add_args(buffer: ReplayBuffer) -> list[object]:
    blobs, rewards, schema = buffer.encode({"x": np.ones((1, 2), np.float32),
                                            "log_rewards": np.zeros(1)})
    from redisbuf.store.containers import schema_to_json

    return [schema_to_json(schema), 1, "", blobs[0], "0.0", "batch-1"]


def _refused(admin: redis.Redis, *calls) -> None:
    """Each call raises NoPermissionError and leaves every buffer key as it was."""
    for call in calls:
        before = _snapshot(admin)
        with pytest.raises(redis.exceptions.NoPermissionError):
            call()
        assert _snapshot(admin) == before


def test_actor_adds_and_touches_no_other_key(setup, real_client):
    name, other, buffer, user = setup
    actor = user("actor")
    assert _fcall(actor, "rb_add", name, *_add_args(buffer))[:2] == [5, 1]
    assert len(buffer) == 5
    _refused(
        real_client,
        lambda: actor.hset(BufferKeys(other).items, "000000000001", b"x"),
        lambda: actor.flushall(),
        lambda: actor.keys("*"),
        lambda: _fcall(actor, "rb_add", other, *_add_args(buffer)),  # another buffer
        lambda: actor.eval("return 1", 0),  # its own code
        lambda: actor.function_load(functions.library_source(), replace=True),
        lambda: actor.get("not-a-buffer"),
    )


def test_learner_samples_and_updates_priorities(setup, real_client):
    name, other, buffer, user = setup
    learner = user("learner")
    reply = _fcall(learner, "rb_sample_uniform", name, 2, 0, 1, bytes(12))
    assert reply[2:4] == [b"000000000001", b"000000000002"]
    assert _fcall(learner, "rb_update_priority", name, "000000000001", "3.5")[0] == 1
    assert float(real_client.hget(buffer.keys.per, "000000000001")) == 3.5
    _refused(
        real_client,
        lambda: learner.hset(BufferKeys(other).per, "000000000002", 9),
        lambda: learner.flushdb(),
        lambda: _fcall(learner, "rb_update_priority", other, "000000000001", "1"),
        lambda: learner.execute_command("FUNCTION", "FLUSH"),
    )


def test_operator_reads_only(setup, real_client, redis_server):
    name, other, buffer, user = setup
    operator = user("operator")
    meta, order = buffer.keys.meta, buffer.keys.order
    assert operator.fcall_ro("rb_len", 2, meta, order) == 4
    assert b"length" in operator.fcall_ro("rb_stats", 2, meta, order)
    assert len(_fcall(operator, "rb_sample_uniform_ro", name, 1, 0, 1, bytes(6),
                      read_only=True)) == 4
    assert operator.hgetall(meta)[b"capacity"] == b"16"
    assert operator.hmget(buffer.keys.items, ["000000000001"])[0] == real_client.hget(
        buffer.keys.items, "000000000001")
    _refused(
        real_client,
        lambda: _fcall(operator, "rb_add", name, *_add_args(buffer)),  # keys are read-only
        lambda: _fcall(operator, "rb_sample_uniform", name, 1, 0, 1, bytes(6)),  # counts
        lambda: operator.hset(meta, "capacity", 1),
        lambda: operator.fcall_ro("rb_len", 2, BufferKeys(other).meta, BufferKeys(other).order),
        lambda: operator.keys("*"),
    )


def test_admin_does_everything_on_its_buffer_only(setup, real_client, redis_server, tmp_path):
    name, other, buffer, user = setup
    admin = user("admin")
    pool = admin.connection_pool.connection_kwargs
    url = f"redis://{pool['username']}:s3cret-pw@127.0.0.1:{redis_server.port}/0"
    with ReplayBuffer(url, name, capacity=16, sampler=PERSampler()) as mine:
        mine.add({"x": np.ones((2, 2), np.float32), "log_rewards": np.zeros(2)})
        info = mine.sample_with_info(2)
        mine.update_priority(info.ids, [1.0, 2.0])
        assert mine.save(tmp_path / "a") == 6 and mine.load(tmp_path / "a") == 6
        mine.clear()
    _refused(
        real_client,
        lambda: ReplayBuffer(url, other, capacity=16),
        lambda: admin.function_load(functions.library_source(), replace=True),
        lambda: admin.execute_command("FUNCTION", "DELETE", "redisbuf"),
        lambda: admin.get("not-a-buffer"),
    )


def test_the_printed_line_is_the_applied_rules(capsys):
    assert cli.main(["acl", "demo", "--role", "operator", "--user", "op"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("ACL SETUSER op reset on '%R~rb:{demo}:*'")
    assert line == acl.setuser_line("demo", "operator", "op")
    assert "s3cret" not in line and ">" not in line
