"""Faults under load: the engine core killed while many requests stream. Every open stream ends with an
error event, waiting plain requests and new ones get 503, and the server exits non-zero.

A tensor-parallel rank killed while serving: tests/executor/test_multinode.py."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from streams import Stream, begin
from wick_server import ServerProcess

pytestmark = pytest.mark.slow

NUM_STREAMS = 8
NUM_PLAIN = 2
# Long enough that no stream can end before the fault, however fast the machine.
LONG = {"max_tokens": 450, "ignore_eos": True, "temperature": 0}


@pytest.fixture()
def server(tmp_path: Path, tiny_llama_dir: str) -> Iterator[ServerProcess]:
    process = ServerProcess(["--model", tiny_llama_dir, "--max-model-len", "512"], tmp_path / "serve.log")
    yield process
    process.stop()


def test_killing_the_core_under_load_ends_every_stream_with_an_error(server: ServerProcess):
    url = server.url
    streams: list[Stream] = []
    num_sequences = NUM_PLAIN
    for i in range(NUM_STREAMS):
        if i % 2:
            streams.append(begin(server, "/v1/chat/completions", {
                "messages": [{"role": "user", "content": f"Story {i}"}], "n": 1 + i % 3, **LONG}))
            num_sequences += 1 + i % 3
        else:
            streams.append(begin(server, "/v1/completions", {"prompt": f"Story {i}", **LONG}))
            num_sequences += 1
    plain: list[httpx.Response] = []
    callers = [threading.Thread(target=lambda i=i: plain.append(httpx.post(
        f"{url}/v1/completions", json={"prompt": f"Plain {i}", **LONG}, timeout=120))) for i in range(NUM_PLAIN)]
    for caller in callers:
        caller.start()
    deadline = time.monotonic() + 60
    while f"wick:num_requests_running {num_sequences:.1f}" not in httpx.get(f"{url}/metrics").text:
        assert time.monotonic() < deadline, "the plain requests never started"
        time.sleep(0.05)
    assert all(stream.is_alive() for stream in streams), "a stream finished before the fault"

    os.kill(server.core_pid, signal.SIGKILL)
    for thread in [*streams, *callers]:
        thread.join(60)
    for stream in streams:
        errors = [e["error"] for e in stream.events if isinstance(e, dict) and "error" in e]
        assert len(errors) == 1 and errors[0]["code"] == "engine_unavailable", stream.events[-3:]
        assert stream.events[-1] == "[DONE]" and stream.broken is None
    assert [r.status_code for r in plain] == [503] * NUM_PLAIN
    assert all(r.json()["error"]["code"] == "engine_unavailable" for r in plain)
    late = httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}]})
    assert late.status_code == 503
    assert server.wait() == 1, server.log()[-4000:]
