"""The Lua scripts: documented headers, no modules fakeredis lacks, they compile on both
servers, NOSCRIPT recovery, and error codes that become redisbuf exceptions."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import redis

from redisbuf import ReplayBuffer, errors
from redisbuf.errors import (
    ConfigMismatchError,
    EmptyBufferError,
    InvalidBatchError,
    RedisBufError,
    SchemaError,
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


def _helper_lines(name: str) -> list[str]:
    """The lines of helper ``name`` that the loader pastes (all but its @include lines)."""
    text = (scripts.lua_dir() / f"_{name}.lua").read_text()
    return [line for line in text.splitlines() if not line.startswith("-- @include ")]


@pytest.mark.parametrize("name", OPERATIONS)
def test_each_helper_is_pasted_once_after_the_helpers_it_includes(name):
    source = scripts.load(name)._expanded
    needed = scripts._helpers(scripts._includes(
        (scripts.lua_dir() / f"{name}.lua").read_text()))
    starts = {}
    for helper in needed:
        # a line only this helper has marks where it was pasted, and how often
        marker = next(line for line in _helper_lines(helper)
                      if line.startswith("local function ")
                      or line.startswith("local ") and "=" in line)
        assert source.count(marker + "\n") == 1, f"{name}: _{helper}.lua pasted twice"
        starts[helper] = source.index(marker + "\n")
        for dependency in re.findall(r"^-- @include (\w+)",
                                     (scripts.lua_dir() / f"_{helper}.lua").read_text(),
                                     re.MULTILINE):
            assert starts[dependency] < starts[helper], f"{name}: {dependency} after {helper}"


def test_a_helper_included_along_two_chains_is_pasted_once():
    # add.lua names common, masslog, items, history and insert (which names removers);
    # items and insert name common and masslog again: each comes once, in dependency order
    assert scripts._helpers(["insert"]) == [
        "common", "masslog", "items", "history", "removers", "insert"]
    assert scripts._helpers(["items", "masslog", "common"]) == ["common", "masslog", "items"]
    source = scripts.load("add")._expanded
    assert source.count("local function fmt(x)") == 1
    assert source.count("local function masslog_on(K)") == 1


def test_include_cycles_and_missing_helpers_are_refused(tmp_path, monkeypatch):
    (tmp_path / "add.lua").write_text("-- @include a\nreturn 1\n")
    (tmp_path / "_a.lua").write_text("-- @include b\nlocal A = 1\n")
    (tmp_path / "_b.lua").write_text("-- @include a\nlocal B = 1\n")
    monkeypatch.setattr(scripts, "lua_dir", lambda: tmp_path)
    scripts._helper.cache_clear()
    try:
        with pytest.raises(ValueError, match="cycle: a -> b -> a"):
            scripts._expand("-- @include a\nreturn 1\n")
        with pytest.raises(FileNotFoundError, match="lua include 'nosuch'"):
            scripts._expand("-- @include nosuch\nreturn 1\n")
    finally:
        scripts._helper.cache_clear()


def test_templates_fill_every_place_and_only_places():
    assert scripts.template("flag", NO_WRITES="true").strip() == "local RB_NO_WRITES = true"
    with pytest.raises(KeyError, match="TAG"):
        scripts.template("remember", BODY="return 1")
    with pytest.raises(ValueError, match="NOPE"):
        scripts.template("flag", NO_WRITES="true", NOPE=1)
    assert "{{" not in scripts.load("add").remembering.source
    from redisbuf.store import functions

    assert "{{" not in functions.library_source()


def test_no_lua_in_python_strings():
    """Every Lua line is in lua/: the Python modules that build scripts hold none."""
    root = Path(scripts.__file__).parent
    for module in ("scripts.py", "functions.py"):
        text = (root / module).read_text()
        for lua in ("redis.call(", "redis.register_function", "local function", "cjson.",
                    "table.remove(", "redis.error_reply("):
            assert lua not in text, f"{module} holds Lua ({lua})"


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
        # the read-only variant: flagged no-writes, asks no grant, runs the body read-only
        assert functions._register(
            script.read_only.function, f"OP.{name}(keys, args, true)", None, True, script.keys
        ) in source
    read_only = functions._register("rbs_x_ro", "OP.x(keys, args, true)", None, True, (1, 1))
    assert "function_name = 'rbs_x_ro', flags = {'no-writes'}" in read_only
    assert "rb_refused(keys, args, nil)" in read_only
    assert "return OP.x(keys, args, true)" in read_only


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


@pytest.mark.parametrize("name", OPERATIONS)
def test_every_script_declares_its_key_count_and_retry_kind(name):
    script = scripts.load(name)
    assert script.keys is not None, f"{name}.lua has no '-- @keys' line"
    assert script.retry in scripts.RETRY_KINDS, f"{name}.lua has no '-- @retry' line"
    header = _header(name)
    assert re.search(r"^-- @keys ", header, re.MULTILINE), f"{name}.lua: @keys not in header"
    low, high = script.keys
    listed = [int(i) for i in re.findall(r"KEYS\[(\d+)\]", header)]
    # the header's KEYS lines and the count agree: no listed key beyond the count
    if high is not None:
        assert max(listed) <= high, f"{name}.lua lists KEYS[{max(listed)}] but takes {high}"


def test_a_call_with_another_key_count_is_refused_before_it_is_sent(fake_client, buffer_name):
    buffer = ReplayBuffer(fake_client, buffer_name, capacity=4)
    keys = buffer.keys.all_keys()
    add = scripts.load("add")
    with pytest.raises(ValueError, match=r"lua/add.lua takes 13 keys .*a call passed 16"):
        add(fake_client, [*keys, "rb:{x}:tree:ids", "rb:{x}:tree:slots", "rb:{x}:tree:free"], [])
    with pytest.raises(ValueError, match=r"lua/len.lua takes 2 keys .*passed 1"):
        scripts.load("len")(fake_client, [buffer.keys.meta], [])
    uniform = scripts.load("sample_uniform")
    with pytest.raises(ValueError, match=r"takes 13..14 keys"):
        uniform(fake_client, [*keys, "a", "b"], [1, 1, 0, b"\0" * 6])
    with pytest.raises(ValueError, match=r"lua/drop.lua takes 1.. keys .*passed 0"):
        scripts.load("drop")(fake_client, [], [])
    # the remembering variant's two memory keys are not the script's: 13 + 2 pass the check
    with pytest.raises(ValueError, match="passed 12"):
        scripts.load("add_commit").remembering.check_keys([*keys, "m"])
    scripts.load("add_commit").remembering.check_keys([*keys, "m", "o"])
    assert len(buffer) == 0 and not fake_client.exists(buffer.keys.items)


def test_a_batch_id_is_refused_for_a_script_not_declared_remembered(fake_client, buffer_name):
    buffer = ReplayBuffer(fake_client, buffer_name, capacity=4)
    memory = [buffer.keys.batches, buffer.keys.batches_old]
    with pytest.raises(ValueError, match="'@retry never'"):
        scripts.load("clear")(fake_client, buffer.keys.all_keys(), [], batch=("b", memory, 1.0))
    assert scripts.load("add").retry == "remembered"
    assert scripts.load("sample_uniform").retry == "draw"
    assert scripts.load("init").retry == "safe"


def test_malformed_contract_lines_are_refused():
    with pytest.raises(ValueError, match="not one of"):
        scripts.Script("x", "-- @keys 1\n-- @retry sometimes\nreturn 1\n")
    with pytest.raises(ValueError, match="more than once"):
        scripts.Script("x", "-- @keys 1\n-- @keys 2\nreturn 1\n")
    assert scripts.Script("x", "-- @keys 2..\nreturn 1\n").keys == (2, None)
    assert scripts.Script("x", "-- @keys 2..3\nreturn 1\n").keys == (2, 3)
    assert scripts.Script("x", "return 1\n").keys is None


def test_replay_buffer_retries_by_the_declared_kind(fake_client, buffer_name, monkeypatch):
    from redisbuf.buffers import replay

    retried: list[str] = []

    def recording(call, name=None):
        retried.append("retried")
        return call()

    monkeypatch.setattr(replay, "retrying", recording)
    draw = [1, 1, 0, b"\0" * 6]  # one draw with replacement, ids only
    for max_use, expected in ((None, ["retried"]), (3, [])):
        buffer = ReplayBuffer(fake_client, f"{buffer_name}-{max_use}", capacity=4,
                              max_use=max_use)
        buffer.add({"x": np.arange(3)})
        retried.clear()
        buffer._run("sample_uniform", buffer.keys.all_keys(), draw)  # a draw: counted?
        assert retried == expected
        retried.clear()
        buffer._run("enable_softmax", buffer.keys.all_keys(), [0])  # safe
        assert retried == ["retried"]
        retried.clear()
        assert buffer._run("clear", buffer.keys.all_keys(), []) == 3  # never
        assert retried == []
