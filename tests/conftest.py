"""Fixtures: a fakeredis client (unit tests) and a real Redis server (integration tests).

``client`` is parametrized over both, so one scenario runs on fakeredis and on a real
server; tests that need only one use ``fake_client`` or ``real_client``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import fakeredis
import pytest
import redis
import redis.cluster

from redisbuf.servers.cluster import LocalCluster
from redisbuf.servers.embedded import BIN_ENV, EmbeddedServer, bundled_server_binary

# Every real server of the suite (child processes included) is the bundled valkey 8 unless
# $REDISBUF_SERVER_BIN names another: a redis-server on PATH (Debian's 7.0, installed by
# .ci/setup for the TLS test, has no WAITAOF) must not change what the suite tests.
if not os.environ.get(BIN_ENV) and bundled_server_binary():
    os.environ[BIN_ENV] = bundled_server_binary()  # type: ignore[assignment]


# The files that take longest (measured at load 8), first: with --no-loadscope-reorder
# (.ci/test) pytest-xdist hands out whole files (--dist loadfile) in collection order, two
# at a time to each worker as it frees, so the longest start at once instead of running on
# while the other workers have nothing left to do. Order only: every file still runs whole
# on one worker.
SLOW_FIRST = (
    "test_apex.py", "test_apex_failures.py", "test_cli_ops.py", "test_docs_examples.py",
    "test_torchrl_dqn.py", "test_replica.py", "test_wheel.py", "test_torchgfn_training.py",
    "test_reader.py", "test_sampling_without_replacement.py", "test_cli.py",
    "test_torchgfn_ported_example.py", "test_engine_interleavings.py",
    "test_torchrl_extra.py",
    # then the files with one test of a minute or more at load 8: started last, that test
    # would run on alone
    "test_reverb_processes.py", "test_engine_log_updates.py", "test_diverse.py",
    "test_torchgfn_buffer.py", "test_removers.py", "test_sharded_per_race.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: index for index, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable


@pytest.fixture(scope="session", autouse=True)
def _scripts_keep_their_bounds() -> None:
    """Every script loaded (and the library built) once, with the real bounds: a test that
    lowers the client's bounds (a monkeypatch of redisbuf.store.bounds) leaves the
    scripts' as they are, whichever test happens to load a script first."""
    from redisbuf.store import functions, scripts

    functions.library_source()
    for name in functions.script_names():
        scripts.load(name)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer() as server:
        yield server


@pytest.fixture
def fake_client() -> Iterator[redis.Redis]:
    client = fakeredis.FakeRedis()
    yield client
    client.flushall()


@pytest.fixture
def real_client(redis_server: EmbeddedServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    yield client
    client.close()


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.redis_server)])
def client(request: pytest.FixtureRequest) -> redis.Redis:
    if request.param == "fake":
        return request.getfixturevalue("fake_client")
    return request.getfixturevalue("real_client")


@pytest.fixture
def buffer_name() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalCluster]:
    """A 3-master Redis Cluster on loopback (bundled valkey, slots assigned through
    redis-py), shared by the session's cluster tests; tests that stop a master start
    their own with :class:`LocalCluster`."""
    with LocalCluster(masters=3) as cluster:
        yield cluster


@pytest.fixture
def cluster_client(redis_cluster: LocalCluster) -> Iterator[redis.cluster.RedisCluster]:
    """A RedisCluster client of ``redis_cluster``, every master flushed first."""
    client = redis.cluster.RedisCluster.from_url(redis_cluster.urls[0])
    client.flushall()
    yield client
    client.close()


@pytest.fixture(params=["fcall", "evalsha"])
def flush_scripts(request: pytest.FixtureRequest, client: redis.Redis):
    """Runs the test with ``client``'s scripts as functions of the library, then as
    EVALSHA (redisbuf/store/scripts.py, the runner); returns what takes them off the
    server, as a restart would: FUNCTION FLUSH, or SCRIPT FLUSH."""
    from redisbuf.store import scripts

    if request.param == "evalsha":
        scripts.run_as_functions(client, False)
        return client.script_flush
    return lambda: client.execute_command("FUNCTION", "FLUSH")
