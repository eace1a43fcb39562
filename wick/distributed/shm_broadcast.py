"""A broadcast ring in shared memory: one writer and a fixed set of readers on one machine (vLLM's
MessageQueue idea, without its network side).

The ring is a file in /dev/shm mapped by every process: a header with the processes' ids, then
`n_slots` slots, each a flag the writer raises once the slot holds data, one read flag per reader,
the length of the message and `slot_bytes` of it. A message is a pickle (protocol 5); one longer
than a slot runs on through the next slots, so any size goes through while the readers keep up.
The writer waits for a slot until every reader has read it; a reader waits for the next slot to be
written. A wait spins (yielding the CPU) for a short while, then sleeps in short steps, and checks
now and then that the processes it waits for still run: it raises PeerGone when one has died.

The creator unlinks the file once every reader has attached (`unlink`): the mappings stay, and no
exit path, a crash included, leaves a file behind.
"""

from __future__ import annotations

import mmap
import os
import pickle
import struct
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SPIN_S = 0.005  # after this long a wait sleeps between checks instead of spinning
_SLEEP_S = 0.0002
_LIVENESS_S = 0.5  # how often a wait checks that its peers still run
_META = 64  # per slot: written flag, read flags, ..., the message length in the last 8 bytes
_LENGTH_AT = _META - 8
_MAX_READERS = _LENGTH_AT - 1
_PID = struct.Struct("<q")
_LENGTH = struct.Struct("<Q")
_fence_lock = threading.Lock()


class PeerGone(RuntimeError):
    """The process on the other side of the ring has exited."""


def _fence() -> None:
    # A lock's acquire and release are full memory barriers: the payload is visible before the flag
    # that announces it, also on weakly ordered CPUs.
    with _fence_lock:
        pass


def _alive(pid: int) -> bool:
    """Whether `pid` runs; a zombie (exited, not yet reaped) counts as gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


@dataclass(frozen=True)
class RingHandle:
    """What a reader needs to attach to a ring (picklable)."""

    path: str
    n_readers: int
    n_slots: int
    slot_bytes: int

    @property
    def header_bytes(self) -> int:
        return -(-_PID.size * (1 + self.n_readers) // _META) * _META

    @property
    def total_bytes(self) -> int:
        return self.header_bytes + self.n_slots * (_META + self.slot_bytes)


class ShmBroadcast:
    """The writer's end (`create`) or one reader's end (`attach`) of a ring."""

    def __init__(self, handle: RingHandle, reader: int | None) -> None:
        self.handle = handle
        self.reader = reader
        fd = os.open(handle.path, os.O_RDWR)
        try:
            self._mmap = mmap.mmap(fd, handle.total_bytes)
        finally:
            os.close(fd)
        self._buf = memoryview(self._mmap)
        self._seq = 0
        n = handle.n_readers
        self._all_read = b"\x01" * n
        self._none_read = bytes(n)
        self._flag = 0 if reader is None else 1 + reader  # also its place among the process ids
        _PID.pack_into(self._buf, self._flag * _PID.size, os.getpid())

    @classmethod
    def create(cls, n_readers: int, n_slots: int = 8, slot_bytes: int = 1 << 20) -> ShmBroadcast:
        """A new ring, with this process as its writer."""
        if not 1 <= n_readers <= _MAX_READERS:
            raise ValueError(f"a ring has 1 to {_MAX_READERS} readers, not {n_readers}")
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        handle = RingHandle(os.path.join(folder, f"wick-ring-{os.getpid()}-{uuid.uuid4().hex[:12]}"),
                            n_readers, n_slots, slot_bytes)
        fd = os.open(handle.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, handle.total_bytes)  # zero-filled: nothing written, nothing read
        finally:
            os.close(fd)
        return cls(handle, None)

    @classmethod
    def attach(cls, handle: RingHandle, reader: int) -> ShmBroadcast:
        """Reader number `reader` (0 .. n_readers - 1) of the ring `handle` names."""
        if not 0 <= reader < handle.n_readers:
            raise ValueError(f"reader {reader} of a ring of {handle.n_readers}")
        return cls(handle, reader)

    def unlink(self) -> None:
        """Removes the ring's file (the writer, once every reader has attached)."""
        try:
            os.unlink(self.handle.path)
        except FileNotFoundError:
            pass

    def _slot(self) -> int:
        return self.handle.header_bytes + (self._seq % self.handle.n_slots) * (_META + self.handle.slot_bytes)

    def _pid(self, index: int) -> int:
        return _PID.unpack_from(self._buf, index * _PID.size)[0]

    def send(self, obj: Any) -> None:
        """Writes `obj` for every reader (the writer only)."""
        if self.reader is not None:
            raise RuntimeError("a reader cannot send")
        data = memoryview(pickle.dumps(obj, protocol=5))
        buf, n, slot_bytes = self._buf, self.handle.n_readers, self.handle.slot_bytes
        pos = 0
        while True:
            base = self._slot()
            self._wait(self._free, self._readers_behind, base)
            buf[base] = 0
            chunk = min(slot_bytes, len(data) - pos)
            _LENGTH.pack_into(buf, base + _LENGTH_AT, len(data))
            buf[base + _META:base + _META + chunk] = data[pos:pos + chunk]
            buf[base + 1:base + 1 + n] = self._none_read
            _fence()
            buf[base] = 1
            self._seq += 1
            pos += chunk
            if pos >= len(data):
                return

    def recv(self) -> Any:
        """The next message (a reader only); waits for it."""
        if self.reader is None:
            raise RuntimeError("the writer cannot receive")
        buf, flag, slot_bytes = self._buf, self._flag, self.handle.slot_bytes
        pos, total, parts = 0, None, None
        while True:
            base = self._slot()
            self._wait(self._unread, self._writer_gone, base)
            _fence()
            if total is None:
                total = _LENGTH.unpack_from(buf, base + _LENGTH_AT)[0]
                if total <= slot_bytes:  # the common case: unpickle straight from the ring
                    obj = pickle.loads(buf[base + _META:base + _META + total])
                    self._mark_read(base + flag)
                    return obj
                parts = bytearray(total)
            chunk = min(slot_bytes, total - pos)
            parts[pos:pos + chunk] = buf[base + _META:base + _META + chunk]
            self._mark_read(base + flag)
            pos += chunk
            if pos >= total:
                return pickle.loads(parts)

    def _free(self, base: int) -> bool:
        """Whether the writer may fill the slot at `base`."""
        n = self.handle.n_readers
        return self._buf[base] == 0 or self._buf[base + 1:base + 1 + n] == self._all_read

    def _unread(self, base: int) -> bool:
        """Whether the slot at `base` holds data this reader has not read."""
        return self._buf[base] == 1 and self._buf[base + self._flag] == 0

    def _mark_read(self, at: int) -> None:
        _fence()
        self._buf[at] = 1
        self._seq += 1

    def _readers_behind(self, base: int) -> str | None:
        for i in range(self.handle.n_readers):
            pid = self._pid(1 + i)
            if self._buf[base + 1 + i] == 0 and pid and not _alive(pid):
                return f"reader {i} (pid {pid}) of the ring is gone"
        return None

    def _writer_gone(self, base: int) -> str | None:
        pid = self._pid(0)
        return None if _alive(pid) else f"the ring's writer (pid {pid}) is gone"

    def _wait(self, ready: Callable[[int], bool], gone: Callable[[int], str | None], base: int) -> None:
        if ready(base):
            return
        start = time.monotonic()
        check = start + _LIVENESS_S
        while not ready(base):
            now = time.monotonic()
            if now - start < _SPIN_S:
                os.sched_yield()
            else:
                time.sleep(_SLEEP_S)
            if now >= check:
                reason = gone(base)
                if reason is not None:
                    raise PeerGone(reason)
                check = now + _LIVENESS_S

    def close(self) -> None:
        """Unmaps the ring (the writer also removes its file); safe to call more than once."""
        if self.reader is None:
            self.unlink()
        if not self._mmap.closed:
            self._buf.release()
            self._mmap.close()
