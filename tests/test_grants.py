"""Least privilege closed by default (redisbuf/store/functions.py GRANTS, lua/_grant.lua):
every writing script is classified, and a script without an entry is the buffer
administrator's only, whichever role calls it."""

from __future__ import annotations

import uuid

import pytest
import redis

from redisbuf import ReplayBuffer, cli
from redisbuf.servers.embedded import EmbeddedServer
from redisbuf.store import functions, scripts
from redisbuf.store.keys import BufferKeys

KINDS = ("add", "sample", "priority", "admin", "rate", "config", "create", "apply")


def test_every_writing_script_has_a_grant_entry():
    """A script added to lua/ without a GRANTS line would be callable by the admin only:
    this names the line to add (the role whose work it is)."""
    missing = [name for name in functions.script_names() if name not in functions.GRANTS
               and name not in scripts.READS]
    assert not missing, (
        f"lua/{missing[0]}.lua has no grant: add \"{missing[0]}\" to GRANTS in "
        "redisbuf/store/functions.py under the kind of the role that runs it ('add': "
        "actors' inserts, 'sample': learners' draws and their samplers' set-up, "
        "'priority': priority updates, 'admin': creating, configuring, clearing, "
        "restoring; lua/_grant.lua). Until then only the buffer's admin may call it. "
        f"All without one: {missing}"
    )
    stale = sorted(set(functions.GRANTS) - set(functions.script_names()))
    assert not stale, f"GRANTS names scripts that lua/ no longer has: {stale}"
    assert set(functions.GRANTS.values()) <= set(KINDS)


def test_a_script_without_an_entry_asks_the_admins_grant(monkeypatch):
    monkeypatch.delitem(functions.GRANTS, "add")
    assert functions.grant_of("add") == "admin"
    assert functions.grant_of("update_priority") == "priority"
    # the library built without it: the function of lua/add.lua asks "admin"
    source = functions.library_source.__wrapped__()
    plain = scripts.load("add").function
    registration = source[source.index(f"function_name = '{plain}'"):]
    assert "rb_refused(keys, args, 'admin')" in registration[:600]


PROBE = """-- a writing script nobody classified
-- @keys 1
redis.call('HSET', KEYS[1], 'probe', ARGV[1])
return 1
"""


@pytest.fixture(scope="module")
def probe_server():
    """A server of its own: the test loads a library with one more script, which must not
    replace the one the rest of the suite's server runs."""
    with EmbeddedServer() as server:
        yield server


def test_a_function_without_a_grant_refuses_every_role_but_admin(probe_server, monkeypatch,
                                                                 tmp_path):
    admin = redis.Redis.from_url(probe_server.url)
    name = f"g-{uuid.uuid4().hex[:6]}"
    ReplayBuffer(admin, name, capacity=4)  # installs this version's library: before the probe's
    meta = BufferKeys(name).meta
    functions.library_source()  # cached unpatched first: the probe's is built apart
    probe = scripts.Script("zz_probe", PROBE)
    load = scripts.load
    names = functions.script_names
    monkeypatch.setattr(functions, "script_names", lambda: [*names(), "zz_probe"])
    monkeypatch.setattr(scripts, "load", lambda name: probe if name == "zz_probe" else load(name))
    source = functions.library_source.__wrapped__()
    admin.execute_command("FUNCTION", "LOAD", "REPLACE", source)
    secret = tmp_path / "pw"
    secret.write_text("s3cret-pw\n")
    try:
        for role in ("actor", "learner", "operator", "admin"):
            username = f"{role}-{uuid.uuid4().hex[:6]}"
            assert cli.main(["acl", name, "--role", role, "--user", username, "--apply",
                             "--url", probe_server.url, "--password-file", str(secret)]) == 0
            user = redis.Redis(host="127.0.0.1", port=probe_server.port, username=username,
                               password="s3cret-pw")
            try:
                if role == "admin":
                    assert user.fcall(probe.function, 1, meta, role) == 1
                    assert admin.hget(meta, "probe") == b"admin"
                else:
                    # the operator may not FCALL at all; the others are refused by the check
                    why = ("no permissions to run the 'fcall'" if role == "operator" else
                           f"may not configure, clear or restore buffer {name}")
                    with pytest.raises(redis.exceptions.NoPermissionError, match=why):
                        user.fcall(probe.function, 1, meta, role)
                    assert admin.hget(meta, "probe") in (None, b"admin")
            finally:
                user.close()
                admin.execute_command("ACL", "DELUSER", username)
    finally:
        admin.execute_command("FUNCTION", "DELETE", functions.LIBRARY)
        admin.close()
