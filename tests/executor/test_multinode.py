"""Tensor parallelism through the real server (CPU, gloo): `wick serve -tp 2`, and two "nodes" on one
machine (node 0 serves, node 1 runs workers only), give the answers of one rank; killing any of their
processes leaves none behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from entrypoints.openai.wick_server import ServerProcess
from processes import descendants, process_exists

from wick import LLM, SamplingParams

pytestmark = pytest.mark.slow
PROMPT = "The capital of France is"
FLAGS = ["--max-model-len", "128", "--max-num-seqs", "4"]


@pytest.fixture(scope="module")
def expected(tiny_llama_dir: str) -> str:
    llm = LLM(tiny_llama_dir, max_model_len=128, max_num_seqs=4)
    return llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))[0].outputs[0].text


def _complete(url: str) -> str:
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0.0, "ignore_eos": True}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def _wait_gone(pids: set[int], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(process_exists(p) for p in pids):
        time.sleep(0.2)
    assert not any(process_exists(p) for p in pids), f"left behind: {[p for p in pids if process_exists(p)]}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_tp2_answers_as_one_rank_and_a_dead_rank_stops_it(tiny_llama_dir: str, expected: str,
                                                                 tmp_path: Path) -> None:
    server = ServerProcess(["--model", tiny_llama_dir, "-tp", "2", *FLAGS], tmp_path / "serve.log")
    try:
        assert _complete(server.url) == expected
        family = descendants(server.process.pid)
        (worker,) = [p for p in family if "wick.executor.worker_process" in Path(f"/proc/{p}/cmdline").read_text()]
        os.kill(worker, signal.SIGKILL)
        assert server.wait() != 0
        assert "exited with code -9; the engine stops" in server.log()
        _wait_gone(family)
    finally:
        server.stop()


def test_two_nodes_serve_as_one_rank_and_stop_with_node_0(tiny_llama_dir: str, expected: str,
                                                         tmp_path: Path) -> None:
    nodes = ["-tp", "2", "--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(_free_port())]
    with open(tmp_path / "node1.log", "w") as log:
        node1 = subprocess.Popen([sys.executable, "-m", "wick.cli.main", "serve", "--model", tiny_llama_dir,
                                  *FLAGS, *nodes, "--node-rank", "1"], stdout=log, stderr=subprocess.STDOUT)
    try:
        server = ServerProcess(["--model", tiny_llama_dir, *FLAGS, *nodes, "--node-rank", "0"], tmp_path / "node0.log")
        try:
            assert _complete(server.url) == expected
            family = descendants(node1.pid) | {node1.pid}
            assert len(family) == 2  # node 1's launcher and its one rank; no HTTP server
        finally:
            assert server.stop() == 0
        assert node1.wait(60) == 0  # node 0 told its workers to stop
        _wait_gone(family)
    finally:
        if node1.poll() is None:
            node1.kill()
