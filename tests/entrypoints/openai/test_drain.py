"""SIGTERM drains `wick serve`: new requests get 503 and /health says so, running requests finish (or are
stopped cleanly at --shutdown-timeout), the server exits 0; a second signal stops it at once.

A small random-weight model serves; a stopped (SIGSTOP) engine core keeps requests running for as long
as a test needs."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from processes import process_exists
from streams import begin
from wick_server import ServerProcess

pytestmark = pytest.mark.slow

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
# Greedy: random sampling over the vocabulary is what a starved CPU does slowest.
LONG = {"ignore_eos": True, "temperature": 0}


def start(tmp_path: Path, tiny_llama_dir: str, *args: str) -> ServerProcess:
    return ServerProcess(["--model", tiny_llama_dir, "--max-model-len", "256", *args], tmp_path / "serve.log")


@pytest.fixture()
def stopped_core(request: pytest.FixtureRequest) -> Iterator[list[int]]:
    """Pids to SIGCONT after the test, whatever happens."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if process_exists(pid):
            os.kill(pid, signal.SIGCONT)


def test_sigterm_refuses_new_requests_and_lets_running_ones_finish(tmp_path: Path, tiny_llama_dir: str,
                                                                   stopped_core: list[int]):
    server = start(tmp_path, tiny_llama_dir, "--shutdown-timeout", "300")
    try:
        body = {"prompt": "Hi", "max_tokens": 60, **LONG}
        running = [begin(server, COMPLETIONS, body), begin(server, CHAT, {
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 60, **LONG, "n": 2})]
        stopped_core.append(server.core_pid)
        os.kill(server.core_pid, signal.SIGSTOP)
        server.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while (health := httpx.get(f"{server.url}/health")).status_code == 200:
            assert time.monotonic() < deadline, "the server never started draining"
            time.sleep(0.05)
        assert health.status_code == 503 and health.json()["error"]["code"] == "server_shutting_down"
        for path, new in ((COMPLETIONS, body), (CHAT, {"messages": [{"role": "user", "content": "Hi"}]}),
                          ("/tokenize", {"prompt": "Hi"})):
            refused = httpx.post(f"{server.url}{path}", json=new)
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_shutting_down"
        assert server.process.poll() is None
        os.kill(server.core_pid, signal.SIGCONT)
        assert server.wait(300) == 0, server.log()[-4000:]
        for stream in running:
            stream.join(30)
        assert running[0].finish_reasons() == ["length"] and running[0].events[-1] == "[DONE]"
        assert running[1].finish_reasons() == ["length", "length"] and running[1].events[-1] == "[DONE]"
        assert not process_exists(server.core_pid)
    finally:
        server.stop()


def test_requests_still_running_at_the_shutdown_timeout_end_cleanly(tmp_path: Path, tiny_llama_dir: str,
                                                                    stopped_core: list[int]):
    server = start(tmp_path, tiny_llama_dir, "--shutdown-timeout", "1")
    try:
        stream = begin(server, CHAT, {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 200,
                                      **LONG, "stream_options": {"include_usage": True}})
        results: dict[str, httpx.Response] = {}
        plain = threading.Thread(target=lambda: results.setdefault("plain", httpx.post(
            f"{server.url}{COMPLETIONS}", json={"prompt": "Hi", "max_tokens": 200, **LONG},
            timeout=60)))
        plain.start()
        deadline = time.monotonic() + 10
        while "wick:num_requests_running 2.0" not in httpx.get(f"{server.url}/metrics").text:
            assert time.monotonic() < deadline, "the second request never started"
            time.sleep(0.05)
        stopped_core.append(server.core_pid)
        os.kill(server.core_pid, signal.SIGSTOP)
        sent = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        stream.join(30)
        plain.join(30)
        assert 1.0 <= time.monotonic() - sent < 10
        os.kill(server.core_pid, signal.SIGCONT)
        assert server.wait(60) == 0, server.log()[-4000:]
    finally:
        server.stop()
    assert stream.finish_reasons() == ["abort"] and stream.events[-1] == "[DONE]", stream.events
    usage = next(e["usage"] for e in stream.events if isinstance(e, dict) and e.get("usage"))
    assert 0 < usage["completion_tokens"] < 200
    assert results["plain"].status_code == 503, results["plain"].text
    assert results["plain"].json()["error"]["code"] == "server_shutting_down"
    assert "shutdown timeout: stopped 2 unfinished requests" in server.log()


def test_a_second_signal_stops_at_once(tmp_path: Path, tiny_llama_dir: str, stopped_core: list[int]):
    server = start(tmp_path, tiny_llama_dir, "--shutdown-timeout", "600")
    try:
        begin(server, COMPLETIONS, {"prompt": "Hi", "max_tokens": 200, **LONG})
        stopped_core.append(server.core_pid)
        os.kill(server.core_pid, signal.SIGSTOP)
        server.process.send_signal(signal.SIGTERM)
        while httpx.get(f"{server.url}/health").status_code == 200:
            time.sleep(0.05)
        sent = time.monotonic()
        server.process.send_signal(signal.SIGINT)
        os.kill(server.core_pid, signal.SIGCONT)
        assert server.wait(30) == 128 + signal.SIGINT, server.log()[-4000:]
        assert time.monotonic() - sent < 10
        assert not process_exists(server.core_pid)
    finally:
        server.stop()
