"""Batches of a step-referencing buffer drawn in sampler processes, so that the draws'
decoding and gathering (Python, one GIL a process) run on several cores at once.

Each sampler process opens the buffer itself (``opener``: a ``module:function`` name and
its arguments, called in the process, returning the step store and the buffer), then
draws what the reader asks of it, :func:`~redisbuf.buffers.step_reads.sample_batch` at a
time, and sends each batch back over a socket: a msgpack header (the SampleInfo fields
as typed bytes, each column's dtype and shape), then every column's bytes, received
straight into the reader's arrays. No pickle: nothing but msgpack and raw array bytes
crosses the socket. A thread of the process sends the batches, in the order they were
drawn, while the next draw goes on; at most ``_OUTBOX`` wait to be sent, so a process
whose reader takes nothing draws that many answers ahead of it, then waits.

:func:`draws_in_processes` is the reader's side. It keeps ``depth`` requests under way
per process and yields each request's parts as they come. When the iteration ends (or
the generator is closed), every process is told to stop and the reader waits until each
has exited. A process exits once no draw of its own is under way (its draws go through a
:class:`~redisbuf.buffers.step_reads.DrawGate`), so then none of the reader's is, and
none starts. A process that loses its reader (it died, or closed the socket) stops the
same way.
"""

from __future__ import annotations

import builtins
import importlib
import os
import queue
import selectors
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from ..errors import RateLimitTimeoutError, SamplerProcessError
from . import step_reads
from .step_reads import INFO_FIELDS, SampledBatch, SampledItem

_LENGTH = struct.Struct("<Q")
#: how long a stopping reader waits for a sampler process to exit before killing it
_EXIT_WAIT = 30.0
#: the most answers a sampler process holds drawn and not yet sent
_OUTBOX = 2


# -- the wire: frames of a length and msgpack, then raw array bytes ------------------------


def _send(sock: socket.socket, message: dict[str, Any],
          arrays: Sequence[np.ndarray] = ()) -> None:
    body = msgpack.packb(message, use_bin_type=True)
    sock.sendall(_LENGTH.pack(len(body)) + body)
    for array in arrays:
        if array.nbytes:
            sock.sendall(np.ascontiguousarray(array).data.cast("B"))


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    while len(view):
        got = sock.recv_into(view)
        if got == 0:
            raise EOFError("the other end closed the socket")
        view = view[got:]


def _recv(sock: socket.socket) -> dict[str, Any]:
    head = bytearray(_LENGTH.size)
    _recv_into(sock, memoryview(head))
    body = bytearray(_LENGTH.unpack(head)[0])
    _recv_into(sock, memoryview(body))
    return msgpack.unpackb(body, raw=False)


def _spec(array: np.ndarray) -> list[Any]:
    return [array.dtype.str, list(array.shape)]


def _recv_array(sock: socket.socket, spec: list[Any]) -> np.ndarray:
    array = np.empty(tuple(spec[1]), dtype=np.dtype(spec[0]))
    if array.nbytes:
        _recv_into(sock, array.data.cast("B"))
    return array


def _send_batch(sock: socket.socket, batch: SampledBatch, last: bool, ended: bool) -> None:
    info = [np.ascontiguousarray(getattr(batch, name)) for name in INFO_FIELDS]
    if batch.columns is not None:
        arrays, ragged = [*info, *batch.columns], None
    else:
        items = batch.items or []
        arrays = [*info, *(column for item in items for column in item.columns)]
        ragged = [[item.key, item.probability, item.table_size, item.priority,
                   item.times_sampled, item.episode, len(item.columns)] for item in items]
    _send(sock, {"batch": [_spec(a) for a in arrays], "columns": batch.columns is not None,
                 "ragged": ragged, "last": last, "ended": ended}, arrays)


def _recv_batch(sock: socket.socket, message: dict[str, Any]) -> SampledBatch:
    arrays = [_recv_array(sock, spec) for spec in message["batch"]]
    keys, probabilities, sizes, priorities, times = arrays[:len(INFO_FIELDS)]
    rest = arrays[len(INFO_FIELDS):]
    if message["columns"]:
        return SampledBatch(keys, probabilities, sizes, priorities, times, rest)
    items, at = [], 0
    for key, probability, size, priority, uses, episode, count in message["ragged"]:
        items.append(SampledItem(key, probability, size, priority, uses,
                                 rest[at:at + count], episode))
        at += count
    return SampledBatch(keys, probabilities, sizes, priorities, times, None, items)


def _error_message(exc: BaseException) -> dict[str, Any]:
    kind = type(exc)
    return {"error": [kind.__module__, kind.__qualname__, str(exc)]}


def _error_of(answer: dict[str, Any]) -> tuple[str, str, str]:
    module, name, text = answer["error"]
    return module, name, text


def _rebuilt(module: str, name: str, text: str, pid: int) -> BaseException:
    """The error sampler process ``pid`` sent, as its own class when that is redisbuf's
    or a builtin exception (else :class:`SamplerProcessError`)."""
    kind: Any = None
    if module == "builtins":
        kind = getattr(builtins, name, None)
    elif module == "redisbuf" or module.startswith("redisbuf."):
        try:
            kind = importlib.import_module(module)
            for part in name.split("."):
                kind = getattr(kind, part)
        except (ImportError, AttributeError):
            kind = None
    if isinstance(kind, type) and issubclass(kind, BaseException):
        try:
            return kind(text)
        except Exception:  # noqa: BLE001 - a constructor of other arguments
            pass
    return SamplerProcessError(f"sampler process {pid} failed: {module}.{name}: {text}")


# -- the sampler process -------------------------------------------------------------------


def _serve(sock: socket.socket) -> None:
    """One sampler process's life: open, then answer draws until told to stop."""
    config = _recv(sock)
    try:
        module, _, function = config["opener"].partition(":")
        store, buffer = getattr(importlib.import_module(module), function)(*config["args"])
    except Exception as exc:  # noqa: BLE001 - sent to the reader, who raises it
        _send(sock, _error_message(exc))
        return
    _send(sock, {"ready": True})
    timeout = config["timeout"]
    requests: queue.Queue[int] = queue.Queue()
    gate = step_reads.DrawGate()

    def listen() -> None:
        try:
            while True:
                message = _recv(sock)
                if "draw" not in message:
                    break
                requests.put(message["draw"])
        except (EOFError, OSError):
            pass  # the reader is gone: stop as if told to
        # once no draw is under way, none starts: the process ends here and now, even
        # while its other thread waits on the rate limiter or reads chunks
        gate.close()
        os._exit(0)

    threading.Thread(target=listen, daemon=True, name="redisbuf-sampler-listen").start()
    # a thread of its own sends the batches, in order, so that the next draw goes on while
    # the last batch waits for the reader, who reads one process's batch at a time
    outbox: queue.Queue[Callable[[], None] | None] = queue.Queue(maxsize=_OUTBOX)

    def send() -> None:
        gone = False
        while (message := outbox.get()) is not None:
            if gone:
                continue
            try:
                message()
            except OSError:
                gone = True  # the reader is gone: the listening thread ends the process

    sender = threading.Thread(target=send, daemon=True, name="redisbuf-sampler-send")
    sender.start()
    try:
        while True:
            want, have = requests.get(), 0
            try:
                while have < want:
                    part = step_reads.sample_batch(store, buffer, want - have,
                                                   timeout=timeout, gate=gate)
                    have += len(part)
                    outbox.put(partial(_send_batch, sock, part, last=have >= want,
                                       ended=False))
            except step_reads.DrawStopped:
                return
            except RateLimitTimeoutError:
                outbox.put(partial(_send, sock, {"batch": None, "last": True, "ended": True}))
            except Exception as exc:  # noqa: BLE001 - sent to the reader, who raises it
                outbox.put(partial(_send, sock, _error_message(exc)))
    finally:
        outbox.put(None)
        sender.join()


def main(argv: list[str]) -> int:
    """A sampler process's entry (``argv``: the socket's file descriptor): serve the
    reader on it."""
    sock = socket.socket(fileno=int(argv[0]))
    try:
        _serve(sock)
    except (EOFError, OSError):
        pass  # the reader closed the socket while a batch was on its way
    finally:
        sock.close()
    return 0


# -- the reader's side ---------------------------------------------------------------------


@dataclass
class _Sampler:
    process: subprocess.Popen[bytes]
    sock: socket.socket
    pending: int = 0  # requests sent and not yet answered whole
    parts: list[SampledBatch] | None = None


def _start(opener: str, args: list[Any], timeout: float | None) -> _Sampler:
    ours, theirs = socket.socketpair()
    # the process imports this redisbuf, wherever the reader found it (appended to its
    # path, so that nothing else on it is shadowed)
    root = str(Path(__file__).resolve().parents[2])
    boot = (f"import sys; sys.path.append({root!r}); "
            f"from redisbuf.buffers.batch_processes import main; "
            f"raise SystemExit(main([{str(theirs.fileno())!r}]))")
    try:
        process = subprocess.Popen([sys.executable, "-c", boot], pass_fds=(theirs.fileno(),),
                                   stdin=subprocess.DEVNULL)
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    sampler = _Sampler(process, ours)
    _send(ours, {"opener": opener, "args": args, "timeout": timeout})
    return sampler


def _answer(sampler: _Sampler) -> dict[str, Any]:
    try:
        return _recv(sampler.sock)
    except (EOFError, OSError) as exc:
        code = sampler.process.poll()
        raise SamplerProcessError(f"sampler process {sampler.process.pid} exited without "
                                  f"answering (exit code {code})") from exc


def _stop(samplers: list[_Sampler]) -> None:
    for sampler in samplers:
        try:
            _send(sampler.sock, {"stop": True})
        except OSError:
            pass
        sampler.sock.close()  # a process blocked sending a batch fails, and exits
    for sampler in samplers:
        try:
            sampler.process.wait(_EXIT_WAIT)
        except subprocess.TimeoutExpired:
            sampler.process.kill()
            sampler.process.wait()


def draws_in_processes(opener: str, args: list[Any], processes: int, sizes: Callable[[], int],
                       timeout: float | None, depth: int = 2
                       ) -> Generator[tuple[list[SampledBatch], bool], None, None]:
    """The draws of ``processes`` sampler processes, each opening its buffer with
    ``opener(*args)``, as ``(parts, ended)`` per request as they come: ``parts`` the
    batches of one draw of ``sizes()`` items (one batch, or more when the rate limiter
    admitted fewer at a time), ``ended`` True when the rate limiter held a draw back
    longer than ``timeout`` seconds (then ``parts`` holds what came before, and the
    iteration ends). Each process has up to ``depth`` requests under way; a request of
    ``sizes() == 0`` items is never sent, and the iteration ends once none is under way.

    Raises:
        SamplerProcessError: a process failed with an error that is not redisbuf's or a
            builtin one, or exited without answering; redisbuf's and builtin errors are
            raised as they were raised in the process.
    """
    samplers: list[_Sampler] = []
    watch = selectors.DefaultSelector()
    try:
        for _ in range(processes):
            samplers.append(_start(opener, args, timeout))
        for sampler in samplers:
            answer = _answer(sampler)
            if "error" in answer:
                raise _rebuilt(*_error_of(answer), sampler.process.pid)
        for sampler in samplers:
            watch.register(sampler.sock, selectors.EVENT_READ, sampler)

        def ask(sampler: _Sampler) -> None:
            while sampler.pending < depth and (want := sizes()) > 0:
                _send(sampler.sock, {"draw": want})
                sampler.pending += 1

        for sampler in samplers:
            ask(sampler)
        while any(s.pending for s in samplers):
            for event, _ in watch.select():
                sampler = event.data
                answer = _answer(sampler)
                if "error" in answer:
                    raise _rebuilt(*_error_of(answer), sampler.process.pid)
                parts = sampler.parts = sampler.parts or []
                if answer["batch"] is not None:
                    parts.append(_recv_batch(sampler.sock, answer))
                if not answer["last"]:
                    continue
                sampler.parts, sampler.pending = None, sampler.pending - 1
                if answer["ended"]:
                    yield parts, True
                    return
                ask(sampler)
                yield parts, False
    finally:
        watch.close()
        _stop(samplers)
