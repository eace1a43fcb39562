"""`wick serve` as a process: bad flags, a missing model, signals, and the engine core dying under it.

The process tests that stop or break their server use a small random-weight model, which loads fast."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from processes import process_exists
from wick_server import ServerProcess


def run_serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "wick.cli.main", "serve", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("args", [
    ["--no-such-flag"],
    ["--port", "eighty"],
    ["--port", "70000"],
    ["--max-num-seqs", "0"],
    ["--dtype", "fp7"],
    ["--model", "/no/such/model.gguf"],
    ["--w", "/no/such/folder"],
    ["--max-queued-requests", "0"],
    ["--max-request-body-bytes", "-1"],
    ["--shutdown-timeout", "-1"],
])
def test_bad_flags_and_missing_model_exit_2_with_one_line(args: list[str]):
    result = run_serve(*args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "error" in lines[0] and "Traceback" not in result.stderr, result.stderr


def test_a_taken_port_exits_2():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = run_serve("--port", str(taken.getsockname()[1]))
    assert result.returncode == 2 and "cannot listen" in result.stderr, result.stderr


@pytest.fixture()
def tiny_server(tmp_path: Path, tiny_llama_dir: str) -> Iterator[ServerProcess]:
    server = ServerProcess(["--model", tiny_llama_dir, "--max-model-len", "256", "--served-model-name", "tiny", "t2"],
                           tmp_path / "serve.log")
    yield server
    server.stop()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_stop_the_server_and_its_core(tiny_server: ServerProcess, sig: signal.Signals):
    assert [m["id"] for m in httpx.get(f"{tiny_server.url}/v1/models").json()["data"]] == ["tiny", "t2"]
    response = httpx.post(f"{tiny_server.url}/v1/completions", json={"model": "t2", "prompt": "Hi", "max_tokens": 3})
    assert response.status_code == 200 and response.json()["model"] == "t2"
    tiny_server.process.send_signal(sig)
    assert tiny_server.wait() == 0, tiny_server.log()[-4000:]
    assert not process_exists(tiny_server.core_pid)


def test_a_dead_core_gets_503_and_the_server_exits_non_zero(tiny_server: ServerProcess):
    url = tiny_server.url
    body = {"prompt": "Hi", "max_tokens": 200, "ignore_eos": True}
    results: dict[str, httpx.Response] = {}

    def call(name: str, stream: bool) -> None:
        results[name] = httpx.post(f"{url}/v1/completions", json={**body, "stream": stream}, timeout=60)

    # A stopped core takes requests in but never answers them: they are in flight when it dies.
    os.kill(tiny_server.core_pid, signal.SIGSTOP)
    callers = [threading.Thread(target=call, args=(name, name == "stream")) for name in ("plain", "stream")]
    for caller in callers:
        caller.start()
    time.sleep(1.0)
    os.kill(tiny_server.core_pid, signal.SIGKILL)
    for caller in callers:
        caller.join(30)
    for name in ("plain", "stream"):
        assert results[name].status_code == 503, results[name].text
        assert results[name].json()["error"]["code"] == "engine_unavailable"
    late = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
    assert late.status_code == 503 and "error" in late.json()
    assert tiny_server.wait() != 0
    assert "the engine core is gone" in tiny_server.log()
