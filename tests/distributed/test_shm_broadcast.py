"""The shared-memory broadcast ring with real processes: every reader gets every message in order,
messages longer than a slot and than the whole ring included; a writer or a reader that dies is
noticed by the other side instead of a wait that never ends."""

from __future__ import annotations

import multiprocessing
import os
import random
from pathlib import Path

import pytest

from wick.distributed.shm_broadcast import PeerGone, RingHandle, ShmBroadcast

_ctx = multiprocessing.get_context("fork")
N_MESSAGES = 600
SLOT_BYTES = 256
N_SLOTS = 4


def _message(i: int) -> dict:
    rng = random.Random(i)
    # Mostly small, as decode steps are; every 7th longer than one slot, every 50th longer than the ring.
    size = 5000 if i % 50 == 0 else 700 if i % 7 == 0 else rng.randrange(0, 40)
    return {"seq": i, "tokens": [rng.randrange(1 << 17) for _ in range(size)]}


def _read_all(handle: RingHandle, reader: int, results: multiprocessing.Queue) -> None:
    ring = ShmBroadcast.attach(handle, reader)
    mismatches = [i for i in range(N_MESSAGES) if ring.recv() != _message(i)]
    ring.close()
    results.put((reader, mismatches))


def test_every_reader_gets_every_message_in_order() -> None:
    ring = ShmBroadcast.create(2, n_slots=N_SLOTS, slot_bytes=SLOT_BYTES)
    results = _ctx.Queue()
    readers = [_ctx.Process(target=_read_all, args=(ring.handle, r, results)) for r in range(2)]
    for process in readers:
        process.start()
    try:
        for i in range(N_MESSAGES):
            ring.send(_message(i))
        assert sorted(results.get(timeout=120) for _ in readers) == [(0, []), (1, [])]
    finally:
        for process in readers:
            process.join(30)
        ring.close()
    assert [p.exitcode for p in readers] == [0, 0]
    assert not Path(ring.handle.path).exists()


def _read_one_and_die(handle: RingHandle) -> None:
    ShmBroadcast.attach(handle, 1).recv()
    os._exit(0)


def _read_forever(handle: RingHandle) -> None:
    ring = ShmBroadcast.attach(handle, 0)
    while True:
        ring.recv()


def test_the_writer_stops_when_a_reader_dies() -> None:
    ring = ShmBroadcast.create(2, n_slots=N_SLOTS, slot_bytes=SLOT_BYTES)
    alive = _ctx.Process(target=_read_forever, args=(ring.handle,), daemon=True)
    dying = _ctx.Process(target=_read_one_and_die, args=(ring.handle,))
    alive.start()
    dying.start()
    try:
        ring.send("first")
        dying.join(30)
        with pytest.raises(PeerGone, match=f"reader 1 \\(pid {dying.pid}\\)"):
            for i in range(N_SLOTS + 1):  # the ring fills up behind the dead reader
                ring.send(i)
    finally:
        alive.kill()
        alive.join()
        ring.close()


def _write_and_die(handles: multiprocessing.Queue) -> None:
    ring = ShmBroadcast.create(1, n_slots=N_SLOTS, slot_bytes=SLOT_BYTES)
    handles.put(ring.handle)
    ring.send("hello")
    ring.send([0] * 1000)  # longer than a slot: the reader gets it while the writer still runs
    os._exit(0)  # no close: the file stays, as after a crash


def test_a_reader_stops_when_the_writer_dies() -> None:
    handles = _ctx.Queue()
    writer = _ctx.Process(target=_write_and_die, args=(handles,))
    writer.start()
    handle = handles.get(timeout=30)
    ring = ShmBroadcast.attach(handle, 0)
    try:
        assert ring.recv() == "hello"
        assert ring.recv() == [0] * 1000
        with pytest.raises(PeerGone, match=f"writer \\(pid {writer.pid}\\) is gone"):
            ring.recv()
    finally:
        writer.join(30)
        ring.unlink()
        ring.close()


def test_a_reader_cannot_send_and_the_writer_cannot_receive() -> None:
    ring = ShmBroadcast.create(1)
    reader = ShmBroadcast.attach(ring.handle, 0)
    try:
        with pytest.raises(RuntimeError, match="a reader cannot send"):
            reader.send(1)
        with pytest.raises(RuntimeError, match="the writer cannot receive"):
            ring.recv()
    finally:
        reader.close()
        ring.close()
