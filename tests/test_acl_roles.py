"""Per-buffer ACL roles (redisbuf/ops/acl.py, ``redisbuf acl``) on a real server: each role does
its job; what it may not do is refused with NoPermissionError and changes no key."""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import redis
from key_contents import key_contents

from redisbuf import PERSampler, ReplayBuffer, cli
from redisbuf.ops import acl
from redisbuf.servers.embedded import EmbeddedServer
from redisbuf.store import functions
from redisbuf.store.keys import BufferKeys

pytestmark = pytest.mark.redis_server


def _snapshot(client: redis.Redis) -> dict[bytes, object]:
    return key_contents(client, sorted(client.scan_iter(match="rb:*")))


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
    update = [b"000000000001", np.array([3.5], ">f8").tobytes()]  # one append
    assert len(_fcall(learner, "rb_update_priority", name, *update)) == 5
    assert buffer.priorities([1]).tolist() == [3.5]
    _refused(
        real_client,
        lambda: learner.hset(BufferKeys(other).items, "000000000002", 9),
        lambda: learner.flushdb(),
        lambda: _fcall(learner, "rb_update_priority", other, *update),
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


# -- the roles' table, on every kind of server at hand ------------------------------------

DEBIAN_SERVER = "/usr/bin/redis-server"
ROLE_NAMES = ("actor", "learner", "operator")
EVERYONE = frozenset(ROLE_NAMES)


@pytest.fixture(scope="module")
def debian_server():
    if not os.path.exists(DEBIAN_SERVER):
        pytest.skip(f"needs Debian's redis-server (7.0) at {DEBIAN_SERVER}; .ci/test installs it")
    with EmbeddedServer(binary=DEBIAN_SERVER) as server:
        yield server


@pytest.fixture(params=["valkey", "debian-redis"])
def any_server(request):
    """The bundled valkey 8.1 (the suite's server), then Debian's redis-server 7.0."""
    return request.getfixturevalue("redis_server" if request.param == "valkey" else "debian_server")


class Refused(Exception):
    """A `redisbuf` command that failed for want of permission."""


@dataclass
class Context:
    url: str  # the role user's
    user: redis.Redis
    name: str
    admin: redis.Redis
    tmp_path: Path
    capsys: pytest.CaptureFixture[str]


def _cli(ctx: Context, *argv: str) -> str:
    ctx.capsys.readouterr()
    code = cli.main([*argv, "--url", ctx.url])
    out, err = ctx.capsys.readouterr()
    if code != 0:
        if "permission" in err.lower() or "may not" in err:
            raise Refused(err)
        raise AssertionError(f"redisbuf {' '.join(argv)} failed otherwise: {err}")
    return out


def _user_fcall(ctx: Context, function: str, *args: object, read_only: bool = False) -> object:
    keys = BufferKeys(ctx.name).all_keys()
    call = ctx.user.fcall_ro if read_only else ctx.user.fcall
    return call(function, len(keys), *keys, *args)


def _py_add(ctx: Context) -> None:
    with ReplayBuffer.open(ctx.url, ctx.name) as mine:
        assert mine.add(_items(2)).ids.tolist() == [5, 6]
    assert ctx.admin.zcard(BufferKeys(ctx.name).order) == 6


def _py_sample_uniform(ctx: Context) -> None:
    with ReplayBuffer.open(ctx.url, ctx.name) as mine:
        assert mine.sample(3)["x"].shape == (3, 2)
    assert int(ctx.admin.hget(BufferKeys(ctx.name).meta, "sampled")) == 3


def _py_sample_per_and_update(ctx: Context) -> None:
    with ReplayBuffer.open(ctx.url, ctx.name, sampler=PERSampler()) as mine:
        info = mine.sample_with_info(2)
        mine.update_priority(info.ids, [7.0, 7.0])
    read = ReplayBuffer(ctx.admin, ctx.name, capacity=None).priorities(info.ids)
    assert read.tolist() == [7.0, 7.0]


def _py_update(ctx: Context) -> None:
    with ReplayBuffer.open(ctx.url, ctx.name, sampler=PERSampler()) as mine:
        mine.update_priority([1, 2], [3.0, 4.0])
    assert ReplayBuffer(ctx.admin, ctx.name, capacity=None).priorities([2]).tolist() == [4.0]


def _py_remove(ctx: Context) -> None:
    with ReplayBuffer.open(ctx.url, ctx.name) as mine:
        assert mine.remove([2]) == 1
    assert not ctx.admin.hexists(BufferKeys(ctx.name).items, "000000000002")


def _py_inspect(ctx: Context) -> None:
    with ReplayBuffer.open(ctx.url, ctx.name) as mine:
        assert len(mine) == 4 and mine.stats()["length"] == 4


def _py_get(ctx: Context) -> None:
    with ReplayBuffer.open(ctx.url, ctx.name) as mine:
        assert mine.get([1, 2])["x"].shape == (2, 2)


def _py_clear(ctx: Context) -> None:
    with ReplayBuffer.open(ctx.url, ctx.name) as mine:
        mine.clear()


def _py_set_lifetime(ctx: Context) -> None:
    ReplayBuffer.open(ctx.url, ctx.name, max_use=3)


def _py_create(ctx: Context) -> None:
    ReplayBuffer(ctx.url, ctx.name + "-new", capacity=8)


def _cli_inspect(ctx: Context) -> None:
    assert json.loads(_cli(ctx, "inspect", ctx.name, "--json"))["length"] == 4


def _cli_watch(ctx: Context) -> None:
    out = _cli(ctx, "watch", ctx.name, "--json", "--count", "1", "--interval", "0.05")
    assert json.loads(out)["name"] == ctx.name


def _cli_export(ctx: Context) -> None:
    target = ctx.tmp_path / "export.rbuf"
    _cli(ctx, "export", ctx.name, str(target))
    copy = ReplayBuffer(ctx.admin, ctx.name + "-copy", capacity=8, sampler=PERSampler())
    assert copy.load(target) == 4


def _cli_drop(ctx: Context) -> None:
    _cli(ctx, "drop", ctx.name, "--yes")


def _cli_import(ctx: Context) -> None:
    saved = ctx.tmp_path / "saved.rbuf"
    ReplayBuffer.open(ctx.admin, ctx.name).save(saved)
    _cli(ctx, "import", str(saved), ctx.name, "--yes")


def _fcall_add(ctx: Context) -> None:
    buffer = ReplayBuffer.open(ctx.admin, ctx.name)
    assert _user_fcall(ctx, "rb_add", *_add_args(buffer))[:2] == [5, 1]


def _fcall_sample(ctx: Context) -> None:
    reply = _user_fcall(ctx, "rb_sample_uniform", 2, 0, 1, bytes(12))
    assert reply[2:4] == [b"000000000001", b"000000000002"]


def _fcall_update(ctx: Context) -> None:
    update = [b"000000000001", np.array([3.5], ">f8").tobytes()]  # one append
    assert len(_user_fcall(ctx, "rb_update_priority", *update)) == 5
    assert ReplayBuffer(ctx.admin, ctx.name, capacity=None).priorities([1]).tolist() == [3.5]


def _fcall_read(ctx: Context) -> None:
    keys = BufferKeys(ctx.name)
    assert ctx.user.fcall_ro("rb_len", 2, keys.meta, keys.order) == 4
    assert b"length" in ctx.user.fcall_ro("rb_stats", 2, keys.meta, keys.order)
    assert len(_user_fcall(ctx, "rb_sample_uniform_ro", 1, 0, 0, bytes(6), read_only=True)) == 3


def _fcall_read_blobs(ctx: Context) -> None:
    assert len(_user_fcall(ctx, "rb_sample_uniform_ro", 1, 0, 1, bytes(6), read_only=True)) == 4


def _native_item_reads(ctx: Context) -> None:
    items = BufferKeys(ctx.name).items
    for read in (lambda: ctx.user.hget(items, "000000000001"),
                 lambda: ctx.user.hmget(items, ["000000000001"]),
                 lambda: ctx.user.hgetall(items), lambda: ctx.user.hscan(items),
                 lambda: ctx.user.hkeys(items), lambda: ctx.user.hrandfield(items),
                 lambda: ctx.user.dump(items)):
        assert read()


def _fcall_init(ctx: Context) -> None:
    keys = BufferKeys(ctx.name + "-new")
    ctx.user.fcall("rb_init", 2, keys.meta, keys.shards, 8, "fifo", 1, 0, "600.0")


# operation -> the roles (besides admin) that may run it; everyone else is refused with
# every key unchanged. Reading the counters is everyone's; reading the items is not the
# actor's (it may write the items hash, not read it).
READERS = frozenset({"learner", "operator"})
TABLE: dict[str, tuple[Callable[[Context], None], frozenset[str]]] = {
    "python add": (_py_add, frozenset({"actor"})),
    "python sample (uniform)": (_py_sample_uniform, frozenset({"learner"})),
    "python sample by priority, update priorities": (_py_sample_per_and_update,
                                                     frozenset({"learner"})),
    "python update priorities": (_py_update, frozenset({"learner"})),
    "python remove by id": (_py_remove, frozenset({"learner"})),
    "python len, stats": (_py_inspect, EVERYONE),
    "python get": (_py_get, READERS),
    "python clear": (_py_clear, frozenset()),
    "python create a buffer": (_py_create, frozenset()),
    "python open asking for a lifetime setting": (_py_set_lifetime, frozenset()),
    "redisbuf inspect (top items)": (_cli_inspect, READERS),
    "redisbuf watch (top items)": (_cli_watch, READERS),
    "redisbuf export": (_cli_export, READERS),
    "redisbuf drop": (_cli_drop, frozenset()),
    "redisbuf import": (_cli_import, frozenset()),
    "FCALL rb_add": (_fcall_add, frozenset({"actor"})),
    "FCALL rb_sample_uniform": (_fcall_sample, frozenset({"learner"})),
    "FCALL rb_update_priority": (_fcall_update, frozenset({"learner"})),
    "FCALL_RO rb_len, rb_stats, rb_sample_uniform_ro (ids)": (_fcall_read, EVERYONE),
    "FCALL_RO rb_sample_uniform_ro (blobs)": (_fcall_read_blobs, READERS),
    "HGET, HMGET, HGETALL, HSCAN, HKEYS, HRANDFIELD, DUMP of the items": (_native_item_reads,
                                                                         READERS),
    "FCALL rb_init": (_fcall_init, frozenset()),
}


def _items(n: int) -> dict[str, np.ndarray]:
    return {"x": np.ones((n, 2), np.float32), "log_rewards": np.zeros(n)}


@pytest.mark.parametrize("role", ROLE_NAMES)
@pytest.mark.parametrize("operation", list(TABLE))
def test_the_roles_table(any_server, role, operation, tmp_path, capsys):
    """Each role runs its operations from Python, the command and FCALL, and is refused
    every other change (NoPermissionError, or the command's permission error) with every
    key unchanged, on valkey and on Redis 7.0."""
    admin = redis.Redis.from_url(any_server.url)
    functions.install(admin)  # the administrator's `redisbuf functions install`
    name = f"t-{uuid.uuid4().hex[:6]}"
    buffer = ReplayBuffer(admin, name, capacity=16, sampler=PERSampler())
    buffer.add(_items(4))
    username = f"{role}-{uuid.uuid4().hex[:6]}"
    secret = tmp_path / "pw"
    secret.write_text("s3cret-pw\n")
    assert cli.main(["acl", name, "--role", role, "--user", username, "--apply",
                     "--url", any_server.url, "--password-file", str(secret)]) == 0
    url = f"redis://{username}:s3cret-pw@127.0.0.1:{any_server.port}/0"
    user = redis.Redis.from_url(url)
    ctx = Context(url, user, name, admin, tmp_path, capsys)
    run, allowed = TABLE[operation]
    try:
        if role in allowed:
            run(ctx)
        else:
            before = _snapshot(admin)
            with pytest.raises((redis.exceptions.NoPermissionError, Refused,
                                redis.exceptions.ResponseError)) as refused:
                run(ctx)
            # a command a function runs and ACL refuses: "The user executing the script
            # can't access at least one of the keys" (an ERR reply, not NOPERM)
            assert any(word in str(refused.value).lower()
                       for word in ("permission", "may not", "can't access")), refused.value
            assert _snapshot(admin) == before
    finally:
        user.close()
        admin.execute_command("ACL", "DELUSER", username)
        for key in admin.scan_iter(match=f"rb:{{{name}*"):
            admin.delete(key)
        admin.close()


def test_apply_leaves_out_only_what_the_server_does_not_know(any_server, tmp_path, capsys):
    admin = redis.Redis.from_url(any_server.url)
    secret = tmp_path / "pw"
    secret.write_text("s3cret-pw\n")
    version = tuple(int(part) for part in admin.info("server")["redis_version"].split(".")[:2])
    capsys.readouterr()
    assert cli.main(["acl", "demo", "--role", "actor", "--user", "omit-probe", "--apply",
                     "--url", any_server.url, "--password-file", str(secret), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    try:
        assert document["omitted"] == ([] if version >= (7, 2) else ["+client|setinfo"])
        assert document["rules"] == [rule for rule in acl.rules("demo", "actor")
                                     if rule not in document["omitted"]]
        # what was applied is what the server holds (ACL GETUSER lists the channels)
        channels = admin.acl_getuser("omit-probe")["channels"]
        assert set(channels) == {"&rb:{demo}:changed", "&rb:{demo}:grant:add"}
    finally:
        admin.execute_command("ACL", "DELUSER", "omit-probe")
        admin.close()



def test_a_learner_on_a_large_buffer_publishes_the_snapshot(redis_server, real_client, tmp_path):
    """From _SNAP_MIN_ITEMS items on, a learner's first draw writes the buffer's snapshot
    (lua/snapshot_commit.lua): part of sampling, so the learner role may do it."""
    from redisbuf.sampling.replica import _SNAP_MIN_ITEMS

    functions.install(real_client)
    name, total = f"aclbig-{uuid.uuid4().hex[:6]}", _SNAP_MIN_ITEMS + 10
    big = ReplayBuffer(real_client, name, capacity=total, sampler=PERSampler())
    for start in range(0, total, 1000):
        big.add({"x": np.zeros((min(1000, total - start), 1), np.float32)})
    secret = tmp_path / "pw"
    secret.write_text("s3cret-pw\n")
    username = f"learner-{uuid.uuid4().hex[:6]}"
    assert cli.main(["acl", name, "--role", "learner", "--user", username, "--apply",
                     "--url", redis_server.url, "--password-file", str(secret)]) == 0
    try:
        learner = redis.Redis(host="127.0.0.1", port=redis_server.port, username=username,
                              password="s3cret-pw")
        # as every process of a run opens it: with the capacity (an existing buffer's
        # meta is only read, which needs no admin grant)
        own = ReplayBuffer(learner, name, capacity=total, sampler=PERSampler())
        assert own.sample(64)["x"].shape == (64, 1)
        assert real_client.hget(big.keys.snap, "header") is not None
    finally:
        real_client.execute_command("ACL", "DELUSER", username)


# -- the actor writes items but never reads them ------------------------------------------

def _glob(pattern: str, key: str) -> bool:
    """Redis's glob (``*``, ``?``, ``[^...]``) as fnmatch spells it (``[!...]``)."""
    import fnmatch

    return fnmatch.fnmatchcase(key, pattern.replace("[^", "[!"))


def test_the_actors_key_patterns_cover_every_key_but_the_items():
    from redisbuf.buffers.episodes import EpisodeKeys
    from redisbuf.buffers.fragments import FragmentKeys
    from redisbuf.buffers.sequence import SequenceKeys

    name = "demo"
    keys = BufferKeys(name)
    every = {*keys.all_keys(), keys.shards, keys.snap, keys.snap_staging("t1"),
             keys.drawing("t2"), keys.quarantine, *SequenceKeys(name).all_keys(),
             *EpisodeKeys(name).all_keys(), *FragmentKeys(name).all_keys()}
    payload = {f"rb:{{{name}}}:{suffix}" for suffix in acl.PAYLOAD}
    assert payload <= every
    rules = acl.actor_keys(name)
    readable = [r[1:] for r in rules if r.startswith("~")]
    for key in sorted(every):
        assert any(_glob(p, key) for p in readable) == (key not in payload), key
        assert (f"%W~{key}" in rules) == (key in payload), key
    staged = "rb:{demo}:staging:tok:items"
    assert not any(_glob(p, staged) for p in readable)
    assert not any(_glob(p, "rb:{other}:meta") for p in readable)
    assert rules[-1] == "(+fcall +fcall_ro ~rb:{demo}:*)"


def _role_user(server, name: str, role: str, tmp_path) -> tuple[str, redis.Redis]:
    secret = tmp_path / "pw"
    secret.write_text("s3cret-pw\n")
    username = f"{role}-{uuid.uuid4().hex[:6]}"
    assert cli.main(["acl", name, "--role", role, "--user", username, "--apply",
                     "--url", server.url, "--password-file", str(secret)]) == 0
    return username, redis.Redis(host="127.0.0.1", port=server.port, username=username,
                                 password="s3cret-pw")


def test_the_actor_cannot_move_the_items_to_read_them(any_server, tmp_path):
    admin = redis.Redis.from_url(any_server.url)
    functions.install(admin)
    name = f"mv-{uuid.uuid4().hex[:6]}"
    ReplayBuffer(admin, name, capacity=8).add(_items(2))
    keys = BufferKeys(name)
    username, actor = _role_user(any_server, name, "actor", tmp_path)
    try:
        _refused(admin,
                 lambda: actor.rename(keys.items, keys.meta[:-4] + "copy"),
                 lambda: actor.copy(keys.items, keys.meta[:-4] + "copy"),
                 lambda: actor.hscan(keys.items))
        assert actor.hlen(keys.items) == 2 and actor.hexists(keys.items, "000000000001")
    finally:
        actor.close()
        admin.execute_command("ACL", "DELUSER", username)
        admin.close()


def test_an_actors_add_leaves_orphan_blobs_to_a_caller_that_may_read_them(any_server,
                                                                         tmp_path):
    """Blobs no item owns (a writer died between its transaction and its retry) are
    removed by the next add, which must read the items hash to find them: the actor's
    add goes on without, and the next reader's add removes them."""
    admin = redis.Redis.from_url(any_server.url)
    functions.install(admin)
    name = f"orph-{uuid.uuid4().hex[:6]}"
    buffer = ReplayBuffer(admin, name, capacity=8)
    buffer.add(_items(2))
    keys = BufferKeys(name)
    admin.hset(keys.items, "000000009999", b"an orphan")
    url_of = f"redis://{{}}:s3cret-pw@127.0.0.1:{any_server.port}/0"
    username, actor = _role_user(any_server, name, "actor", tmp_path)
    try:
        with ReplayBuffer.open(url_of.format(username), name) as mine:
            assert mine.add(_items(1)).ids.tolist() == [3]
        assert admin.hexists(keys.items, "000000009999")
        buffer.add(_items(1))
        assert not admin.hexists(keys.items, "000000009999") and len(buffer) == 4
    finally:
        actor.close()
        admin.execute_command("ACL", "DELUSER", username)
        admin.close()


# -- the printed lines work on the server they are printed for -------------------------------

def _paste(admin: redis.Redis, line: str) -> None:
    """Run a printed line as redis-cli would (its quoting is the shell's)."""
    import shlex

    words = shlex.split(line)
    assert words[:2] == ["ACL", "SETUSER"]
    admin.execute_command(*words)


@pytest.mark.parametrize("role", acl.ROLES)
def test_a_line_printed_for_a_server_works_there(any_server, role, capsys):
    admin = redis.Redis.from_url(any_server.url)
    version = tuple(int(p) for p in admin.info("server")["redis_version"].split(".")[:2])
    user = f"paste-{role}"
    try:
        capsys.readouterr()
        assert cli.main(["acl", "demo", "--role", role, "--user", user,
                         "--url", any_server.url]) == 0
        out, err = capsys.readouterr()
        line = out.strip()
        _paste(admin, line)  # accepted whole
        assert "on" in admin.acl_getuser(user)["flags"]
        assert f"version {admin.info('server')['redis_version']}" in err
        newest = "+client|setinfo" in acl.rules("demo", role)  # all roles but admin's
        assert ("+client|setinfo" in line) == (newest and version >= (7, 2))
        assert cli.main(["acl", "demo", "--role", role, "--user", user]) == 0
        out, err = capsys.readouterr()
        assert f"for Redis >= {'7.2' if newest else '7.0'} and valkey" in err and "--url" in err
        if version >= (7, 2) or not newest:
            _paste(admin, out.strip())
        else:  # the newest servers' line: Redis 7.0 refuses it whole, as the note says
            with pytest.raises(redis.exceptions.ResponseError, match="client|setinfo"):
                _paste(admin, out.strip())
    finally:
        admin.execute_command("ACL", "DELUSER", user)
        admin.close()


def test_an_actors_large_add_is_stored_by_a_learner_and_waited_for_by_an_operator(
    setup, real_client, monkeypatch
):
    from redisbuf.buffers import staged
    from redisbuf.store import applying

    name, _other, buffer, user = setup
    actor, learner, operator = user("actor"), user("learner"), user("operator")
    monkeypatch.setattr(staged, "_store_the_rest", lambda client, keys: None)  # gone
    n = 3 * 1024 + 1
    big = ReplayBuffer.open(actor, name)
    ids = big.add({"x": np.ones((n, 2), np.float32), "log_rewards": np.zeros(n)}).ids
    assert len(ids) == n and real_client.hexists(buffer.keys.meta, "applying")
    meta, order = buffer.keys.meta, buffer.keys.order
    waited = []
    waiter = threading.Thread(target=lambda: waited.append(applying.finish(operator, meta)))
    waiter.start()  # the operator may not store slices: it waits for someone who may
    waiter.join(0.3)
    assert waiter.is_alive()
    assert len(ReplayBuffer(learner, name, capacity=16, sampler=PERSampler())) == 16
    waiter.join(30)
    assert waited == [[1, 0, 0, 0]] and operator.fcall_ro("rb_len", 2, meta, order) == 16
