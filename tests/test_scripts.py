"""The Lua scripts: documented headers, no modules fakeredis lacks, they compile on both
servers, NOSCRIPT recovery, and error codes that become redisbuf exceptions."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import redis

from redisbuf import (
    ConfigMismatchError,
    EmptyBufferError,
    InvalidBatchError,
    RedisBufError,
    ReplayBuffer,
    SchemaError,
    errors,
)
from redisbuf.store import scripts

OPERATIONS = sorted(p.stem for p in scripts.lua_dir().glob("*.lua") if not p.stem.startswith("_"))
HELPERS = sorted(p.stem for p in scripts.lua_dir().glob("_*.lua"))


def _header(name: str) -> str:
    """The comment block a script opens with (``-- @include`` lines included)."""
    lines = []
    for line in (scripts.lua_dir() / f"{name}.lua").read_text().splitlines():
        if not line.startswith("--"):
            break
        lines.append(line)
    return "\n".join(lines)


def _code(path) -> str:
    """A script without its comments."""
    return "\n".join(re.sub(r"--.*$", "", line) for line in path.read_text().splitlines())


def test_the_expected_operations_exist():
    expected = {"add", "clear", "enable_softmax", "init", "sample_prioritized", "sample_uniform"}
    assert expected <= set(OPERATIONS)


@pytest.mark.parametrize("name", OPERATIONS)
def test_every_script_documents_its_keys_and_argv(name):
    header = _header(name)
    code = _code(scripts.lua_dir() / f"{name}.lua")
    assert header.count("\n") >= 2, f"{name}.lua has no header comment"
    assert "KEYS[1]" in header, f"{name}.lua does not list its KEYS"
    for table in ("KEYS", "ARGV"):
        used = {int(i) for i in re.findall(rf"{table}\[(\d+)\]", code)}
        dynamic = re.search(rf"{table}\[[^\]\d]", code) or re.search(rf"#{table}\b", code)
        if used or dynamic:
            assert f"{table}[" in header, f"{name}.lua uses {table} without listing it"
        listed = {int(i) for i in re.findall(rf"{table}\[(\d+)\]", header)}
        ranges = [int(i) for i in re.findall(rf"{table}\[(\d+)\.\.", header)]
        for index in used:
            covered = index in listed or any(index >= start for start in ranges)
            assert covered, f"{name}.lua uses {table}[{index}] without documenting it"


@pytest.mark.parametrize("name", OPERATIONS + HELPERS)
def test_no_lua_modules_that_fakeredis_lacks(name):
    code = _code(scripts.lua_dir() / f"{name}.lua")
    for module in ("struct", "cmsgpack", "bit", "cjson.encode_keep_buffer"):
        assert not re.search(rf"\b{re.escape(module)}\s*\.", code), f"{name}.lua uses {module}"
    assert "redis.sha1hex" not in code
    assert not re.search(r"\bloadstring\b|\bdofile\b|\brequire\b", code)


@pytest.mark.parametrize("name", OPERATIONS)
def test_includes_are_expanded(name):
    script = scripts.load(name)
    assert not re.search(r"^-- @include \w+\s*$", script.source, re.MULTILINE)
    for helper in re.findall(r"^-- @include (\w+)", (scripts.lua_dir() / f"{name}.lua").read_text(),
                             re.MULTILINE):
        assert (scripts.lua_dir() / f"_{helper}.lua").read_text().splitlines()[2] in script.source


@pytest.mark.parametrize("name", OPERATIONS)
def test_every_script_compiles_on_the_server(client, name):
    script = scripts.load(name)
    assert client.script_load(script.source) == script.sha
    assert client.script_exists(script.sha) == [True]


def test_noscript_recovery(client, buffer_name, flush_scripts):
    buffer = ReplayBuffer(client, buffer_name, capacity=4, prioritized_sampling=True, seed=0)
    buffer.add({"x": np.arange(3), "log_rewards": np.zeros(3)})
    flush_scripts()
    if not scripts.uses_functions(client):
        assert client.script_exists(scripts.load("add_commit").remembering.sha) == [False]
    result = buffer.add({"x": np.arange(3), "log_rewards": np.zeros(3)})
    assert result.ids.tolist() == [4, 5, 6] and result.evicted == 2
    flush_scripts()
    assert len(buffer.sample(3)["x"]) == 3
    flush_scripts()
    assert len(ReplayBuffer(client, buffer_name, capacity=4).sample(2)["x"]) == 2
    flush_scripts()
    assert buffer.clear() == 4


@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("RB_EMPTY", EmptyBufferError),
        ("RB_SCHEMA", SchemaError),
        ("RB_NOBUF", errors.NoSuchBufferError),
        ("RB_NOLOG", errors.PrioritizedSamplingOffError),
        ("RB_CONFIG", ConfigMismatchError),
        ("RB_BUSY", errors.PerBusyError),
        ("RB_SHARDED", errors.BufferShardedError),
        ("RB_UNSHARDED", errors.BufferNotShardedError),
        ("RB_INVALID", InvalidBatchError),
        ("RB_UNDEFINED", errors.SamplingError),
        ("RB_LIMIT", errors.RequestTooLargeError),
        ("RB_SOMETHINGNEW", RedisBufError),
    ],
)
def test_error_codes_become_redisbuf_exceptions(code, error):
    reply = redis.exceptions.ResponseError(
        f"{code} the detail here script: 0123abcd, on @user_script:12."
    )
    translated = scripts.translate(reply)
    assert type(translated) is error
    assert translated.code == code
    assert str(translated) == "the detail here"
    if error is not RedisBufError:
        assert error.code == code  # the class's own, not set on the instance
        assert "code" not in vars(translated)
        assert errors.SCRIPT_ERRORS[code] is error


def test_every_code_a_script_replies_has_its_own_class():
    """Each RB_* code in lua/ and the FCALL library maps to one class, and no two codes
    share one (a caller tells them apart with except, never by comparing codes)."""
    from redisbuf.store import functions

    sources = [path.read_text() for path in scripts.lua_dir().glob("*.lua")]
    sources.append(Path(functions.__file__).read_text())
    used = set(re.findall(r"'(RB_[A-Z]+)[' ]", "\n".join(sources)))
    assert used and used <= set(errors.SCRIPT_ERRORS), used - set(errors.SCRIPT_ERRORS)
    classes = list(errors.SCRIPT_ERRORS.values())
    assert len(set(classes)) == len(classes)
    # the subclasses keep working where ConfigMismatchError was caught before
    for code in ("RB_NOBUF", "RB_NOLOG", "RB_BUSY", "RB_SHARDED", "RB_UNSHARDED"):
        assert issubclass(errors.SCRIPT_ERRORS[code], ConfigMismatchError)


def test_uncoded_errors_pass_through():
    reply = redis.exceptions.ResponseError("WRONGTYPE Operation against a key")
    assert scripts.translate(reply) is reply


def test_script_errors_reach_python_as_redisbuf_exceptions(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=3)
    buffer.drop()  # meta gone: the add script answers RB_NOBUF
    with pytest.raises(errors.NoSuchBufferError, match="does not exist") as info:
        buffer.add({"x": np.zeros(1)})
    assert isinstance(info.value, ConfigMismatchError) and info.value.code == "RB_NOBUF"
    with pytest.raises(EmptyBufferError, match="buffer is empty"):
        buffer.sample(1)


# -- the runner: functions where the library loads, EVALSHA where it cannot -----------------


def _script_calls(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name: stats.get(f"cmdstat_{name}", {}).get("calls", 0)
            for name in ("fcall", "fcall_ro", "evalsha")}


def test_the_library_holds_every_script_in_its_three_variants():
    from redisbuf.store import functions

    source = functions.library_source()
    for name in OPERATIONS:
        script = scripts.load(name)
        for variant in (script, script.read_only, script.remembering):
            assert f"function_name = '{variant.function}'" in source
            assert variant.function in functions.script_functions()
        assert f"function_name = '{script.read_only.function}', callback = " \
               f"function(keys, args) return OP.{name}(keys, args, true) end, " \
               "flags = {'no-writes'}" in source


@pytest.mark.redis_server
def test_a_buffer_runs_functions_and_reads_with_fcall_ro(real_client, buffer_name):
    buffer = ReplayBuffer(real_client, buffer_name, capacity=8, seed=0)
    buffer.add({"x": np.arange(4), "log_rewards": np.zeros(4)})
    real_client.config_resetstat()
    buffer.add({"x": np.arange(4), "log_rewards": np.zeros(4)})
    buffer.sample(2)
    assert scripts.load("len")(real_client, [buffer.keys.meta, buffer.keys.order], []) == 8
    calls = _script_calls(real_client)
    assert calls["evalsha"] == 0 and calls["fcall"] >= 3  # reserve, commit, draw
    assert calls["fcall_ro"] == 1  # len: a read, which a read-only user may call


@pytest.mark.redis_server
def test_a_script_not_from_lua_runs_with_evalsha(real_client):
    odd = scripts.Script("len", "return 41 + 1")
    real_client.config_resetstat()
    assert odd(real_client, ["rb:{x}:meta", "rb:{x}:order"], []) == 42  # loaded, then run
    calls = _script_calls(real_client)
    assert calls["evalsha"] >= 1 and calls["fcall"] == calls["fcall_ro"] == 0


@pytest.mark.redis_server
def test_without_the_library_scripts_run_with_evalsha_and_say_how_to_get_it(
    real_client, buffer_name
):
    """A user who may not load the library, on a server without it: EVALSHA (all the same
    behaviour); a user who may not run EVALSHA either is told to install the library."""
    real_client.execute_command("FUNCTION", "FLUSH")
    port = real_client.connection_pool.connection_kwargs["port"]
    real_client.execute_command("ACL", "SETUSER", "noload", "on", ">pw", "~*", "&*", "+@all",
                                "-function|load")
    real_client.execute_command("ACL", "SETUSER", "noeval", "on", ">pw", "~*", "&*", "+@all",
                                "-function|load", "-evalsha")
    try:
        noload = redis.Redis(port=port, username="noload", password="pw")
        real_client.config_resetstat()
        with ReplayBuffer(noload, buffer_name, capacity=4) as buffer:
            assert buffer.add({"x": np.arange(3), "log_rewards": np.zeros(3)}).ids.tolist() == [
                1, 2, 3]
            assert len(buffer.sample(2)["x"]) == 2
        calls = _script_calls(real_client)
        assert calls["fcall"] == 0 and calls["evalsha"] >= 3
        noeval = redis.Redis(port=port, username="noeval", password="pw")
        with pytest.raises(redis.exceptions.NoPermissionError, match="redisbuf functions install"):
            ReplayBuffer.open(noeval, buffer_name).sample(1)
    finally:
        for user in ("noload", "noeval"):
            real_client.execute_command("ACL", "DELUSER", user)
