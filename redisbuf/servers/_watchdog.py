"""Keeps an embedded server from outliving the process that started it.

Run by :class:`redisbuf.servers.embedded.EmbeddedServer` as ``python -I -S _watchdog.py DIR
COMMAND...`` with a pipe on stdin (standard library only, so it starts in milliseconds).
It starts COMMAND, prints its pid on stdout, and stops it (SIGTERM, SIGKILL after
``GRACE`` seconds) when stdin reaches EOF: the starting process closed the pipe or died,
SIGKILL included. It also stops it on SIGTERM, SIGINT and SIGHUP. When the server has
exited it removes DIR (the server's working directory) and exits with the server's code.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading

GRACE = 10.0


def main() -> int:
    directory, command = sys.argv[1], sys.argv[2:]
    server = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    sys.stdout.write(f"{server.pid}\n")
    sys.stdout.flush()
    stopping = threading.Event()

    def kill_late() -> None:
        if not stopping.wait(0) or server.returncode is not None:
            return
        try:
            os.kill(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def stop(*_args: object) -> None:
        if stopping.is_set():
            return
        stopping.set()
        try:
            os.kill(server.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        timer = threading.Timer(GRACE, kill_late)
        timer.daemon = True
        timer.start()

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)

    def watch() -> None:
        try:
            sys.stdin.buffer.read()  # returns at EOF: our parent closed the pipe or died
        finally:
            stop()

    threading.Thread(target=watch, daemon=True).start()
    code = server.wait()
    shutil.rmtree(directory, ignore_errors=True)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
