"""The FCALL library (redisbuf/store/functions.py): each function does what the Python path does,
refuses bad input with every key unchanged, and is installed once, versioned."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import redis
from key_contents import key_contents

from redisbuf import PERSampler, ReplayBuffer, cli
from redisbuf.servers.embedded import EmbeddedServer
from redisbuf.store import codec, functions
from redisbuf.store.containers import schema_to_json
from redisbuf.store.keys import BufferKeys

WIRE_FORMAT = Path(__file__).resolve().parent.parent / "docs" / "wire-format.md"


def _snapshot(client: redis.Redis, name: str) -> dict[bytes, object]:
    """Every key of the buffer with its type and content."""
    return key_contents(client, sorted(client.scan_iter(match=BufferKeys(name).pattern)))


def _batch(n: int, start: int = 0) -> dict[str, np.ndarray]:
    return {
        "obs": np.arange(start * 3, (start + n) * 3, dtype=np.float32).reshape(n, 3),
        "log_rewards": np.linspace(-1, 0, n),
    }


def _records(batch: dict[str, np.ndarray]) -> list[bytes]:
    n = len(batch["log_rewards"])
    return [codec.packb({k: v[i] if v.ndim > 1 else float(v[i]) for k, v in
                         sorted(batch.items())}) for i in range(n)]


def _schema(batch: dict[str, np.ndarray]) -> str:
    from redisbuf.store.containers import KINDS

    return schema_to_json(KINDS["dict"].split(batch)[2])


def _fcall_add(client, name, batch, options="", batch_id=None):
    keys = BufferKeys(name).all_keys()
    args: list[object] = [_schema(batch), len(batch["log_rewards"]), options]
    for blob, reward in zip(_records(batch), batch["log_rewards"], strict=True):
        args += [blob, repr(float(reward))]
    if batch_id is not None:
        args.append(batch_id)
    return client.fcall("rb_add", len(keys), *keys, *args)


def test_the_library_is_built_from_the_lua_files_and_versioned():
    source = functions.library_source()
    assert source.startswith("#!lua name=redisbuf\n")
    assert len(functions.version()) == 16
    for name in ("rb_version", "rb_add", "rb_sample_uniform", "rb_update_priority", "rb_len",
                 "rb_stats", "rb_init", "rb_sample_uniform_ro"):
        assert f"function_name = '{name}'" in source
    # one implementation: add.lua's body is in it verbatim
    add_body = (Path(__file__).resolve().parent.parent / "lua" / "add.lua").read_text()
    assert add_body.split("-- @include insert\n", 1)[1] in source


def test_opening_a_buffer_installs_the_library_once(client, buffer_name):
    client.execute_command("FUNCTION", "FLUSH")
    ReplayBuffer(client, buffer_name, capacity=8)
    assert functions.installed_version(client) == functions.version()
    assert client.fcall_ro("rb_version", 0).decode() == functions.version()
    # an older library of the same name is replaced; an identical one is left alone
    client.execute_command(
        "FUNCTION", "LOAD", "REPLACE",
        "#!lua name=redisbuf\nredis.register_function{function_name='rb_version', "
        "callback=function() return 'old' end, flags={'no-writes'}}",
    )
    assert functions.installed_version(client) == "old"
    assert functions.install(client) is True
    assert functions.install(client) is False
    assert functions.installed_version(client) == functions.version()


def test_rb_add_stores_what_python_reads_back_bit_exact(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=5)
    batch = _batch(4)
    assert _fcall_add(client, buffer_name, batch) == [1, 4, 0]
    assert client.fcall_ro("rb_len", 2, buffer.keys.meta, buffer.keys.order) == 4
    got = buffer.get([1, 2, 3, 4])
    assert got["obs"].tobytes() == batch["obs"].tobytes()
    np.testing.assert_array_equal(got["log_rewards"], batch["log_rewards"])
    # Python adds next: same schema, same ids sequence, eviction beyond capacity (FIFO)
    assert buffer.add(_batch(2, 4)).ids.tolist() == [5, 6]
    assert len(buffer) == 5
    assert _fcall_add(client, buffer_name, _batch(1, 6)) == [7, 1, 1]
    assert client.hget(buffer.keys.meta, "schema").decode() == _schema(batch)
    stats = client.fcall_ro("rb_stats", 2, buffer.keys.meta, buffer.keys.order)
    stats = dict(zip(stats[::2], stats[1::2], strict=True))
    assert stats[b"length"] == b"5" and stats[b"inserted"] == b"7" and stats[b"evicted"] == b"2"
    assert not any(key.startswith(b"hist:") for key in stats)


def test_rb_add_with_a_batch_id_stores_the_batch_once(client, buffer_name):
    ReplayBuffer(client, buffer_name, capacity=10)
    first = _fcall_add(client, buffer_name, _batch(3), batch_id="b-1")
    again = _fcall_add(client, buffer_name, _batch(3), batch_id="b-1")
    assert first == again == [1, 3, 0]
    assert client.zcard(BufferKeys(buffer_name).order) == 3
    assert _fcall_add(client, buffer_name, _batch(3), batch_id="b-2") == [4, 3, 0]


@pytest.mark.parametrize(
    "mutate, code",
    [
        (lambda a: a.__setitem__(1, "x"), "RB_INVALID"),  # n not a number
        (lambda a: a.__setitem__(1, 5), "RB_INVALID"),  # n disagrees with the records
        (lambda a: a.__setitem__(0, "{not json"), "RB_SCHEMA"),
        (lambda a: a.__setitem__(0, '{"kind":"dict","fields":{}}'), "RB_SCHEMA"),  # another
        (lambda a: a.__setitem__(4, "nan"), "RB_INVALID"),  # a NaN log-reward
        (lambda a: a.__setitem__(2, '{"per_priorities":["1","2"]}'), "RB_CONFIG"),  # no PER
        (lambda a: a.__setitem__(2, "[1"), "RB_INVALID"),
    ],
)
def test_rb_add_refuses_bad_input_leaving_every_key_unchanged(client, buffer_name, mutate, code):
    buffer = ReplayBuffer(client, buffer_name, capacity=10)
    buffer.add(_batch(2))
    before = _snapshot(client, buffer_name)
    batch = _batch(2, 2)
    keys = buffer.keys.all_keys()
    args: list[object] = [_schema(batch), 2, ""]
    for blob, reward in zip(_records(batch), batch["log_rewards"], strict=True):
        args += [blob, repr(float(reward))]
    mutate(args)
    with pytest.raises(redis.exceptions.ResponseError, match=code):
        client.fcall("rb_add", len(keys), *keys, *args)
    assert _snapshot(client, buffer_name) == before


def test_rb_add_needs_the_buffer_and_refuses_read_only_calls(client, buffer_name):
    keys = BufferKeys(buffer_name).all_keys()
    batch = _batch(1)
    functions.install(client)
    with pytest.raises(redis.exceptions.ResponseError, match="RB_NOBUF"):
        _fcall_add(client, buffer_name, batch)
    assert client.keys("*" + buffer_name + "*") == []
    with pytest.raises(redis.exceptions.ResponseError):
        client.fcall_ro("rb_add", len(keys), *keys, _schema(batch), 1, "", b"x", "0")


def test_rb_init_then_rb_add_creates_a_buffer_python_opens(client, buffer_name):
    functions.install(client)
    keys = BufferKeys(buffer_name)
    meta = client.fcall("rb_init", 2, keys.meta, keys.shards, 16, "fifo", 1, 0, 600)
    assert b"capacity" in meta
    _fcall_add(client, buffer_name, _batch(3))
    buffer = ReplayBuffer.open(client, buffer_name)
    assert buffer.capacity == 16 and buffer.sample(3)["obs"].shape == (3, 3)


def test_rb_sample_uniform_returns_python_records_and_counts_the_draw(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=10)
    batch = _batch(4)
    buffer.add(batch)
    keys = buffer.keys.all_keys()
    uniforms = bytes(6 * 3)  # three draws at u = 0: ranks 0, 1, 2 without replacement
    reply = client.fcall("rb_sample_uniform", len(keys), *keys, 3, 0, 1, uniforms)
    length, first, ids, blobs = reply[0], reply[1], reply[2:5], reply[5:]
    assert (length, first, ids) == (4, 1, [b"000000000001", b"000000000002", b"000000000003"])
    for i, blob in enumerate(blobs):
        assert codec.unpackb(blob)["obs"].tobytes() == batch["obs"][i].tobytes()
    assert buffer.stats()["sampled"] == 3
    # the read-only variant draws the same and counts nothing
    assert client.fcall_ro("rb_sample_uniform_ro", len(keys), *keys, 3, 0, 1, uniforms) == reply
    assert buffer.stats()["sampled"] == 3
    # and a plain call after it counts again: each call sets the flag its helpers read
    # (made once when the library loads, lua/_operation.lua)
    assert client.fcall("rb_sample_uniform", len(keys), *keys, 3, 0, 1, uniforms) == reply
    assert buffer.stats()["sampled"] == 6
    with pytest.raises(redis.exceptions.ResponseError, match="RB_INVALID"):
        client.fcall("rb_sample_uniform", len(keys), *keys, 3, 0, 1, b"short")


def _update_args(ids, priorities, ids_as: str = "text") -> list[bytes]:
    """rb_update_priority's arguments: the ids (12 digits each, or big-endian int64),
    back to back, then big-endian doubles."""
    packed = (b"".join(b"%012d" % i for i in ids) if ids_as == "text"
              else np.asarray(ids, ">i8").tobytes())
    return [packed, np.asarray(priorities, ">f8").tobytes()]


@pytest.mark.parametrize("ids_as", ["text", "binary"])
def test_rb_update_priority_moves_the_python_samplers_draws(client, buffer_name, ids_as):
    buffer = ReplayBuffer(client, buffer_name, capacity=10, sampler=PERSampler(alpha=1.0))
    buffer.add(_batch(4))
    keys = buffer.keys.all_keys()
    # 99 is not stored, nor can -7 and 10^12 be: the replicas skip them (the server looks
    # no id up, and counts none)
    ids, priorities = [1, 2, 3, 4, 99], [0, 0, 0, 5, 1]
    if ids_as == "binary":
        ids, priorities = [*ids, -7, 10**12], [*priorities, 3, 3]
    reply = client.fcall("rb_update_priority", len(keys), *keys,
                         *_update_args(ids, priorities, ids_as))
    entry = client.lindex(buffer.keys.masslog, -1)
    assert entry[:2] == (b"U|" if ids_as == "text" else b"V|")
    assert int(reply[2]) == int(reply[1]) + 1 and len(reply) == 5  # one entry, appended
    info = buffer.sample_with_info(8, replacement=True)
    assert info.ids.tolist() == [4] * 8
    before = _snapshot(client, buffer_name)
    for bad in (-1.0, np.nan, np.inf):
        with pytest.raises(redis.exceptions.ResponseError, match="RB_INVALID priority 0"):
            client.fcall("rb_update_priority", len(keys), *keys, *_update_args([1], [bad]))
    with pytest.raises(redis.exceptions.ResponseError, match="RB_INVALID the ids are 12"):
        client.fcall("rb_update_priority", len(keys), *keys, b"1", bytes(8))
    assert _snapshot(client, buffer_name) == before
    # PER priorities given with rb_add (options JSON, as ReplayBuffer.add(priorities=))
    assert _fcall_add(client, buffer_name, _batch(1, 4), options='{"per_priorities":["7"]}')
    reader = [buffer.keys.meta, buffer.keys.order, buffer.keys.masslog, buffer.keys.snap,
              buffer.keys.per_heap, buffer.keys.per]
    assert client.fcall_ro("rb_priority", len(reader), *reader, 5, 4, 1, 99) == [
        b"7", b"5", b"0", None]


def test_rb_update_priority_with_the_largest_position(client, buffer_name):
    """ARGV[6], the position of the largest priority (what the Python client sends): the
    server checks one byte of each priority instead of finding the largest, with the same
    refusals; a wrong position raises the running max only to that position's priority;
    one out of range is ignored."""
    buffer = ReplayBuffer(client, buffer_name, capacity=10, sampler=PERSampler(alpha=1.0))
    buffer.add(_batch(4), priorities=[0.5] * 4)
    keys = buffer.keys.all_keys()

    def update(priorities, largest, ids=(1, 2, 3)):
        args = _update_args(list(ids), priorities, "binary")
        return client.fcall("rb_update_priority", len(keys), *keys, *args, "", "", "",
                            largest)

    def running_max():
        return float(client.hget(buffer.keys.meta, "per_max"))

    reply = update([1.0, 3.0, 2.0], 2)
    assert int(reply[2]) == int(reply[1]) + 1 and len(reply) == 5  # '' is no replica
    assert running_max() == 3.0
    update([4.0, 9.0, 6.0], 1)  # a wrong position: one of the call's own, not above
    assert running_max() == 4.0
    for position in (0, 4, "x"):  # ignored: the server finds the largest
        update([5.0, 7.0, 8.0 + (position == "x")], position)
    assert running_max() == 9.0
    update([1e305, 1.0, -0.0], 3)  # a first byte of 0x7F or 0x80: checked in full
    assert running_max() == 1e305
    assert buffer.sample_with_info(4, replacement=True).ids.tolist() == [1] * 4
    before = _snapshot(client, buffer_name)
    for bad in (-1.0, np.nan, np.inf, -np.inf):
        with pytest.raises(redis.exceptions.ResponseError, match="RB_INVALID priority 1"):
            update([1.0, bad, 2.0], 3)
    assert _snapshot(client, buffer_name) == before


def test_rb_priority_reads_the_log_then_the_snapshot(client, buffer_name):
    """rb_priority answers every item's current priority from where the priorities are:
    the newest entry naming it, else the snapshot behind the log, else the epoch's base
    (items present when PER was turned on), and nothing for an item not stored."""
    plain = ReplayBuffer(client, buffer_name, capacity=11)
    plain.add(_batch(3))  # present when PER is turned on: the base, 2.5
    buffer = ReplayBuffer(client, buffer_name, capacity=11,
                          sampler=PERSampler(alpha=1.0, initial_priority=2.5), seed=1)
    reader = [buffer.keys.meta, buffer.keys.order, buffer.keys.masslog, buffer.keys.snap,
              buffer.keys.per_heap, buffer.keys.per]

    def read(*ids):
        return [None if v is None else float(v)
                for v in client.fcall_ro("rb_priority", len(reader), *reader, *ids)]

    assert read(1, 2, 3) == [2.5, 2.5, 2.5]
    buffer.add(_batch(6), priorities=[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])  # ids 4..9
    buffer.update_priority([2, 5, 40], [0.5, 9.0, 8.0])
    buffer.sample(2)  # a first read: it writes a snapshot of all this
    assert client.hget(buffer.keys.snap, "header") is not None
    buffer.update_priority([4], [7.5])  # logged after the snapshot
    buffer.add(_batch(4))  # ids 10..13: the two oldest (1, 2) evicted
    assert read(1, 2, 3, 4, 5, 9, 13, 40) == [None, None, 2.5, 7.5, 9.0, 6.0, 9.0, None]
    assert buffer.priorities([3, 4, 13]).tolist() == [2.5, 7.5, 9.0]  # the same script
    with pytest.raises(redis.exceptions.ResponseError, match="RB_LIMIT"):
        read(*range(1, 18))
    # a V entry holds ids as 8 bytes; 12's bytes also stand across two ids (3 << 32 then
    # 12 << 32, neither stored) and in its doubles (the double whose bits are 12): only
    # an id's own place counts, so 12 keeps its priority, 9.0
    ids = np.array([3 << 32, 12 << 32], ">i8")
    assert ids.tobytes()[4:12] == np.array([12], ">i8").tobytes()
    buffer.update_priority(ids, [np.array([12], ">i8").view(">f8")[0], 4.0])
    assert read(12) == [9.0]
    buffer.update_priority([13, 12], [1.5, 0.75])  # the last of its places wins
    buffer.update_priority([12, 12, 5], [0.25, 3.5, 1.0])
    assert read(12, 13, 5) == [3.5, 1.5, 1.0]


def test_rb_sample_per_draws_by_the_current_priorities(client, buffer_name):
    """A client without a replica draws by PER on the server: from the snapshot a Python
    sampler published and the log after it (an update, an add and its evictions since),
    every draw at the current law (chi-square), never an evicted item, each draw's
    priority now returned and its use counted; no snapshot yet: RB_NOSNAP."""
    from test_sampling import chi2, chi2_limit

    buffer = ReplayBuffer(client, buffer_name, capacity=8,
                          sampler=PERSampler(alpha=1.0, eps=0.0), seed=1)
    buffer.add(_batch(6), priorities=[1.0, 2.0, 3.0, 4.0, 0.0, 6.0])  # ids 1..6
    keys = [*buffer.keys.all_keys(), buffer.keys.snap]
    with pytest.raises(redis.exceptions.ResponseError, match="RB_NOSNAP"):
        client.fcall("rb_sample_per", len(keys), *keys, 4, bytes(6 * 64 * 4), 0)
    buffer.sample(2)  # the Python sampler's first read publishes a snapshot
    buffer.update_priority([2, 3], [10.0, 0.0])
    buffer.add(_batch(4), priorities=[5.0, 5.0, 1.0, 0.0])  # ids 7..10: 1 and 2 evicted
    law = {4: 4.0, 6: 6.0, 7: 5.0, 8: 5.0, 9: 1.0}
    total = sum(law.values())
    rng = np.random.default_rng(3)
    seen: dict[int, int] = {}
    draws = 0
    sampled = int(client.hget(buffer.keys.meta, "sampled"))
    for _ in range(60):
        reply = client.fcall("rb_sample_per", len(keys), *keys, 50, rng.bytes(6 * 16 * 50), 1)
        count = int(reply[0])
        ids = [int(i) for i in reply[2].split(b",")] if count else []
        priorities = [float(p) for p in reply[3].split(b",")] if count else []
        assert [law[i] for i in ids] == priorities
        assert reply[4:] == [buffer.client.hget(buffer.keys.items, b"%012d" % i) for i in ids]
        for i in ids:
            seen[i] = seen.get(i, 0) + 1
        draws += count
    assert draws > 2500 and set(seen) <= set(law)
    counts = np.array([seen.get(i, 0) for i in law])
    expected = np.array([draws * law[i] / total for i in law])
    assert chi2(counts, expected) < chi2_limit(len(law) - 1)
    assert int(client.hget(buffer.keys.meta, "sampled")) == sampled + draws


def test_every_function_refuses_a_wrong_number_of_keys_before_it_runs(client, buffer_name):
    # a script reads its keys by position: with one key too few, the masslog would be
    # written to whichever key came 13th
    buffer = ReplayBuffer(client, buffer_name, capacity=10, sampler=PERSampler(alpha=1.0))
    buffer.add(_batch(4))
    keys = buffer.keys.all_keys()
    before = _snapshot(client, buffer_name)
    for function, args in (("rb_update_priority", _update_args([1], [5.0])),
                           ("rb_sample_uniform", [1, 0, 1, bytes(6)]),
                           ("rb_add", [_schema(_batch(1)), 1, "", b"x", "0"])):
        for wrong in (keys[:12], [*keys, keys[0], keys[1]], []):
            with pytest.raises(redis.exceptions.ResponseError, match=(
                    rf"RB_INVALID {function} takes 13(\.\.14)? keys, got {len(wrong)}")):
                client.fcall(function, len(wrong), *wrong, *args)
    plain = functions.script_functions()
    update = next(f for f in plain if f.startswith("rbs_update_priority_") and "_ro_" not in f
                  and "_once_" not in f)
    with pytest.raises(redis.exceptions.ResponseError, match="takes 13 keys, got 2"):
        client.fcall(update, 2, *keys[:2], *_update_args([1], [5.0]))
    remembering = next(f for f in plain if f.startswith("rbs_update_priority_once_"))
    with pytest.raises(redis.exceptions.ResponseError, match="takes 15 keys, got 13"):
        client.fcall(remembering, 13, *keys, *_update_args([1], [5.0]))
    assert _snapshot(client, buffer_name) == before


def test_a_user_without_function_permission_still_opens_buffers(real_client, buffer_name):
    real_client.execute_command("FUNCTION", "FLUSH")
    real_client.execute_command(
        "ACL", "SETUSER", "nofn", "on", ">pw", "~*", "&*", "+@all", "-function"
    )
    try:
        url = real_client.connection_pool.connection_kwargs
        user = redis.Redis(host=url["host"], port=url["port"], username="nofn", password="pw")
        with ReplayBuffer(user, buffer_name, capacity=4) as buffer:
            buffer.add(_batch(2))
            assert len(buffer) == 2
        assert functions.installed_version(real_client) is None
    finally:
        real_client.execute_command("ACL", "DELUSER", "nofn")


# -- the redis-cli example of docs/wire-format.md --------------------------------------


def _docs_cli_block() -> str:
    text = WIRE_FORMAT.read_text()
    match = re.search(r"```console\n(\$ redisbuf functions install .*?)```", text, re.DOTALL)
    assert match, "docs/wire-format.md has no redis-cli example"
    return match.group(1)


def _split_redis_cli(line: str) -> list[bytes]:
    """A line of redis-cli input as redis-cli splits it ("..." with \\xHH escapes, '...')."""
    out = []
    for word in shlex.split(line, posix=False):
        if word.startswith('"'):
            body = word[1:-1].encode("latin-1")
            out.append(body.decode("unicode_escape").encode("latin-1"))
        elif word.startswith("'"):
            out.append(word[1:-1].encode())
        else:
            out.append(word.encode())
    return out


@pytest.mark.redis_server
def test_the_docs_redis_cli_example_adds_a_record_and_samples_it_back():
    block = _docs_cli_block()
    install, cli_line, rest = block.split("\n", 2)
    commands = rest.split("\nEOF\n", 1)[0]
    with EmbeddedServer() as server:
        client = redis.Redis.from_url(server.url)
        argv = shlex.split(install.removeprefix("$ "))
        assert argv[:3] == ["redisbuf", "functions", "install"]
        assert cli.main([*argv[1:-1], server.url]) == 0
        assert functions.installed_version(client) == functions.version()
        redis_cli = shutil.which("redis-cli")
        if redis_cli:  # .ci/test installs Debian's redis-server, which brings redis-cli
            flags = shlex.split(cli_line.removeprefix("$ redis-cli").split("<<")[0])
            done = subprocess.run(
                [redis_cli, "-p", str(server.port), *flags], input=commands.encode() + b"\n",
                capture_output=True, check=True,
            )
            out = done.stdout
            assert b"ERR" not in out, out
        else:  # the same commands through redis-py
            replies = [client.execute_command(*_split_redis_cli(line))
                       for line in commands.splitlines() if line.strip()]
            out = json.dumps(replies, default=repr).encode()
        assert b"000000000001" in out
        buffer = ReplayBuffer.open(server.url, "demo")
        assert buffer.get([1])["x"].tolist() == [1.5]
        assert buffer.stats()["sampled"] == 1
        buffer.close()
        client.close()
