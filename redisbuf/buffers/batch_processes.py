"""Batches of a step-referencing buffer drawn in sampler processes, so that the draws'
decoding and gathering (Python, one GIL a process) run on several cores at once.

Each sampler process opens the buffer itself (``opener``: a ``module:function`` name and
its arguments, called in the process, returning the step store and the buffer), then
draws what the reader asks of it, :func:`~redisbuf.buffers.step_reads.sample_batch` at a
time, and sends each batch back over a socket: a msgpack header (the SampleInfo fields
as typed bytes, each column's dtype and shape), then the columns' bytes, received
straight into the reader's arrays. No pickle: nothing but msgpack and raw array bytes
crosses the socket. A thread of the process sends the batches, in the order they were
drawn, while the next draw goes on; at most ``_OUTBOX`` wait to be sent, so a process
whose reader takes nothing draws that many answers ahead of it, then waits.

Where Linux offers ``memfd_create``, the columns need not cross the socket: the reader
lends each request a slot of shared memory (:class:`_Arena`, one memory file that every
process maps) large enough for the answer, the process gathers the columns straight into
it, and the header says where they lie. The reader's arrays are views of the slot, which
goes back to the reader's free list only once no array of it is left (a weak reference
to the slot's array, which every view of it keeps alive), so a batch a user keeps is
never written over. A request gets no slot (its columns cross the socket) before the
reader has seen an answer's size, or while every slot it may make is held.

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
import mmap
import os
import queue
import selectors
import socket
import struct
import subprocess
import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
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
#: the most slots of shared memory the reader lends at once, per sampler process (0: none)
_SLOTS_PER_PROCESS = 8
#: where a column starts in a slot: a multiple of this many bytes
_ALIGN = 64


# -- the wire: frames of a length and msgpack, then raw array bytes ------------------------


def _send(sock: socket.socket, message: dict[str, Any],
          arrays: Sequence[np.ndarray | None] = ()) -> None:
    """``message``, then the bytes of each of ``arrays`` (None: an array in a slot)."""
    body = msgpack.packb(message, use_bin_type=True)
    sock.sendall(_LENGTH.pack(len(body)) + body)
    for array in arrays:
        if array is not None and array.nbytes:
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


def _spec(array: np.ndarray, slot: _Bump | None) -> list[Any]:
    """``array``'s dtype and shape, and where it starts in ``slot`` when it lies there."""
    spec = [array.dtype.str, list(array.shape)]
    at = None if slot is None else slot.offset_of(array)
    return spec if at is None else [*spec, at]


def _bytes_of(specs: list[list[Any]]) -> int:
    """The bytes of the arrays of ``specs``, together."""
    return sum(np.dtype(spec[0]).itemsize * int(np.prod(spec[1])) for spec in specs)


def _recv_array(sock: socket.socket, spec: list[Any], slot: np.ndarray | None) -> np.ndarray:
    """The array of ``spec``: a view of ``slot`` (the bytes of the request's slot) when
    the spec says where it lies there, else its bytes, read from ``sock``."""
    dtype, shape = np.dtype(spec[0]), tuple(spec[1])
    if len(spec) > 2:
        if slot is None:
            raise SamplerProcessError("a sampler process answered in a slot it was not lent")
        return slot[spec[2] : spec[2] + _bytes_of([spec])].view(dtype).reshape(shape)
    array = np.empty(shape, dtype=dtype)
    if array.nbytes:
        _recv_into(sock, array.data.cast("B"))
    return array


def _send_batch(sock: socket.socket, batch: SampledBatch, last: bool, ended: bool,
                slot: _Bump | None = None) -> None:
    info = [np.ascontiguousarray(getattr(batch, name)) for name in INFO_FIELDS]
    if batch.columns is not None:
        arrays, ragged = [*info, *batch.columns], None
    else:
        items = batch.items or []
        arrays = [*info, *(column for item in items for column in item.columns)]
        ragged = [[item.key, item.probability, item.table_size, item.priority,
                   item.times_sampled, item.episode, len(item.columns)] for item in items]
    specs = [_spec(a, slot) for a in arrays]
    _send(sock, {"batch": specs, "columns": batch.columns is not None, "ragged": ragged,
                 "last": last, "ended": ended},
          [None if len(spec) > 2 else a for spec, a in zip(specs, arrays, strict=True)])


def _recv_batch(sock: socket.socket, message: dict[str, Any],
                slot: np.ndarray | None = None) -> SampledBatch:
    arrays = [_recv_array(sock, spec, slot) for spec in message["batch"]]
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


# -- slots of shared memory ------------------------------------------------------------------


@dataclass
class _Slot:
    offset: int  # in the memory file: a multiple of the page size
    size: int
    mapping: mmap.mmap


class _Arena:
    """The reader's memory file, cut into slots that it lends to requests (see the
    module); at most ``most`` slots exist at once."""

    def __init__(self, fd: int, most: int) -> None:
        self.fd, self.most = fd, most
        self.length = 0  # of the file: slots are made at its end, never moved
        self.slots = 0  # made and not dropped
        self.free: deque[_Slot] = deque()  # appended to by finalizers, in any thread

    @classmethod
    def made(cls, processes: int) -> _Arena | None:
        """The arena of ``processes`` sampler processes; None where there is no memory
        file (not Linux) or no slot may be lent."""
        most = _SLOTS_PER_PROCESS * processes
        if most <= 0 or not hasattr(os, "memfd_create"):
            return None
        try:
            return cls(os.memfd_create("redisbuf-batches", os.MFD_CLOEXEC), most)
        except OSError:
            return None

    def lend(self, size: int) -> tuple[_Slot, np.ndarray] | None:
        """A free slot of at least ``size`` bytes and its bytes, as an array that keeps
        the slot lent while it, or any view of it, lives; None while ``most`` slots are
        lent."""
        slot = None
        for _ in range(len(self.free)):
            free = self.free.popleft()
            if free.size >= size:
                slot = free
                break
            self._drop(free)  # smaller than the answers now are
        if slot is None and (self.slots >= self.most or (slot := self._make(size)) is None):
            return None
        lease = np.frombuffer(slot.mapping, dtype=np.uint8)
        weakref.finalize(lease, self.free.append, slot).atexit = False
        return slot, lease

    def _make(self, size: int) -> _Slot | None:
        size = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
        try:
            os.ftruncate(self.fd, self.length + size)
            slot = _Slot(self.length, size, mmap.mmap(self.fd, size, offset=self.length))
        except OSError:
            return None
        self.length += size
        self.slots += 1
        return slot

    def _drop(self, slot: _Slot) -> None:
        self.slots -= 1
        try:  # its pages go back to the system; the file keeps its length
            slot.mapping.madvise(mmap.MADV_REMOVE)
        except (AttributeError, OSError):
            pass

    def close(self) -> None:
        """Close the file; the slots still lent stay mapped until their arrays go."""
        os.close(self.fd)


class _Bump:
    """A slot as the sampler process fills it for one request: arrays one after the
    other, each at a multiple of ``_ALIGN`` bytes; once it is full, arrays of the
    process's own memory."""

    def __init__(self, mapping: mmap.mmap) -> None:
        self.bytes = np.frombuffer(mapping, dtype=np.uint8)
        self.address = self.bytes.__array_interface__["data"][0]
        self.used = 0

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        size = dtype.itemsize * int(np.prod(shape))
        start = -(-self.used // _ALIGN) * _ALIGN
        if start + size > len(self.bytes):
            return np.empty(shape, dtype)
        self.used = start + size
        return self.bytes[start : start + size].view(dtype).reshape(shape)

    def offset_of(self, array: np.ndarray) -> int | None:
        """Where ``array``'s bytes start in the slot; None unless it lies there whole."""
        if not array.nbytes or not array.flags.c_contiguous:
            return None
        at = int(array.__array_interface__["data"][0]) - self.address
        return at if 0 <= at and at + array.nbytes <= len(self.bytes) else None


class _Mappings:
    """A sampler process's maps of the slots it was lent, by (offset, size): the
    ``most`` last used (a slot the reader dropped is never lent again)."""

    def __init__(self, fd: int | None, most: int) -> None:
        self.fd, self.most = fd, most
        self.maps: dict[tuple[int, int], mmap.mmap] = {}

    def slot(self, lent: list[int] | None) -> _Bump | None:
        if lent is None or self.fd is None:
            return None
        where = (int(lent[0]), int(lent[1]))
        mapping = self.maps.pop(where, None)
        if mapping is None:
            mapping = mmap.mmap(self.fd, where[1], offset=where[0])
        self.maps[where] = mapping  # the last used, last
        while len(self.maps) > self.most:
            del self.maps[next(iter(self.maps))]  # unmapped once no array of it is left
        return _Bump(mapping)


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
    slots = _Mappings(config.get("arena"), config.get("slots", 0))
    requests: queue.Queue[tuple[int, list[int] | None]] = queue.Queue()
    gate = step_reads.DrawGate()

    def listen() -> None:
        try:
            while True:
                message = _recv(sock)
                if "draw" not in message:
                    break
                requests.put((message["draw"], message.get("slot")))
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
            (want, lent), have = requests.get(), 0
            try:
                slot = slots.slot(lent)  # the answer's columns go there, while they fit
                while have < want:
                    part = step_reads.sample_batch(
                        store, buffer, want - have, timeout=timeout, gate=gate,
                        empty=None if slot is None else slot.empty)
                    have += len(part)
                    outbox.put(partial(_send_batch, sock, part, last=have >= want,
                                       ended=False, slot=slot))
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
    # the bytes of each pending request's slot (None: it has none), in request order
    leases: deque[np.ndarray | None] = field(default_factory=deque)


def _start(opener: str, args: list[Any], timeout: float | None,
           arena: _Arena | None = None) -> _Sampler:
    ours, theirs = socket.socketpair()
    # the process imports this redisbuf, wherever the reader found it (appended to its
    # path, so that nothing else on it is shadowed)
    root = str(Path(__file__).resolve().parents[2])
    boot = (f"import sys; sys.path.append({root!r}); "
            f"from redisbuf.buffers.batch_processes import main; "
            f"raise SystemExit(main([{str(theirs.fileno())!r}]))")
    try:
        shared = () if arena is None else (arena.fd,)
        process = subprocess.Popen([sys.executable, "-c", boot],
                                   pass_fds=(theirs.fileno(), *shared),
                                   stdin=subprocess.DEVNULL)
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    sampler = _Sampler(process, ours)
    _send(ours, {"opener": opener, "args": args, "timeout": timeout,
                 "arena": None if arena is None else arena.fd,
                 "slots": 0 if arena is None else arena.most})
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
    arena = _Arena.made(processes)
    # the most bytes of columns an item of an answer has taken so far, and its columns
    item_bytes = columns = 0
    try:
        for _ in range(processes):
            samplers.append(_start(opener, args, timeout, arena))
        for sampler in samplers:
            answer = _answer(sampler)
            if "error" in answer:
                raise _rebuilt(*_error_of(answer), sampler.process.pid)
        for sampler in samplers:
            watch.register(sampler.sock, selectors.EVENT_READ, sampler)

        def ask(sampler: _Sampler) -> None:
            while sampler.pending < depth and (want := sizes()) > 0:
                message: dict[str, Any] = {"draw": want}
                lent = None if arena is None or not item_bytes else arena.lend(
                    want * item_bytes + _ALIGN * columns)
                if lent is not None:
                    message["slot"] = [lent[0].offset, lent[0].size]
                sampler.leases.append(None if lent is None else lent[1])
                _send(sampler.sock, message)
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
                    parts.append(_recv_batch(sampler.sock, answer, sampler.leases[0]))
                    if answer["columns"] and len(parts[-1]):
                        specs = answer["batch"][len(INFO_FIELDS):]
                        columns = len(specs)
                        item_bytes = max(item_bytes, -(-_bytes_of(specs) // len(parts[-1])))
                if not answer["last"]:
                    continue
                sampler.leases.popleft()
                sampler.parts, sampler.pending = None, sampler.pending - 1
                if answer["ended"]:
                    yield parts, True
                    return
                ask(sampler)
                yield parts, False
    finally:
        watch.close()
        _stop(samplers)
        if arena is not None:
            arena.close()
