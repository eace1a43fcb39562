"""Requests refused on arrival, before their body is read: 413 past the body limit (declared or while
reading), 429 with Retry-After past the bound on waiting requests; both counted on /metrics.

A small random-weight model serves; a stopped (SIGSTOP) engine core holds requests in the queue."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from wick_server import ServerProcess

QUEUE_BOUND = 3
BODY_LIMIT = 1 << 20
pytestmark = pytest.mark.slow

COMPLETIONS = "/v1/completions"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: str) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("admission") / "serve.log"
    process = ServerProcess(["--model", tiny_llama_dir, "--max-model-len", "256", "--max-queued-requests",
                             str(QUEUE_BOUND), "--max-request-body-bytes", str(BODY_LIMIT)], log)
    yield process
    assert process.stop() == 0, process.log()[-4000:]


def rejected(server: ServerProcess, reason: str) -> float:
    text = httpx.get(f"{server.url}/metrics").text
    match = re.search(rf'^wick:num_requests_rejected_total{{reason="{reason}"}} (\S+)$', text, re.MULTILINE)
    assert match, text
    return float(match.group(1))


def waiting(server: ServerProcess) -> float:
    text = httpx.get(f"{server.url}/metrics").text
    return float(re.search(r"^wick:num_requests_admitted_waiting (\S+)$", text, re.MULTILINE).group(1))


def assert_openai_error(response: httpx.Response, status: int, code: str | None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if code is not None:
        assert error["code"] == code
    return error


def raw_request(server: ServerProcess, head: str, body_chunks: Iterator[bytes]) -> tuple[bytes, int]:
    """Sends a request over a socket until the server answers or closes; returns its answer and the body
    bytes sent."""
    url = httpx.URL(server.url)
    sent = 0
    with socket.create_connection((url.host, url.port), timeout=30) as sock:
        sock.sendall(head.encode())
        sock.setblocking(False)
        answer = b""
        for chunk in body_chunks:
            try:
                answer += sock.recv(65536)
            except BlockingIOError:
                pass
            if answer:
                break
            try:
                sock.sendall(chunk)
            except BlockingIOError:
                time.sleep(0.01)  # the server reads no faster than it needs to
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
        sock.setblocking(True)
        try:
            while data := sock.recv(65536):
                answer += data
        except ConnectionResetError:
            pass
    return answer, sent


def test_a_declared_body_over_the_limit_gets_413_before_it_is_sent(server: ServerProcess):
    before = rejected(server, "too_large")
    head = (f"POST {COMPLETIONS} HTTP/1.1\r\nHost: wick\r\nContent-Type: application/json\r\n"
            f"Content-Length: {1 << 30}\r\n\r\n")
    answer, sent = raw_request(server, head, iter([b"x" * 65536] * (1 << 14)))
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"connection: close" in answer.lower() and b'"request_too_large"' in answer
    assert sent < 8 * BODY_LIMIT  # what the socket buffers took before the answer came: never the gigabyte
    assert rejected(server, "too_large") == before + 1


def test_a_chunked_body_is_cut_off_at_the_limit(server: ServerProcess):
    head = (f"POST {COMPLETIONS} HTTP/1.1\r\nHost: wick\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n")
    piece = b"a" * 65536
    chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    answer, sent = raw_request(server, head, iter([b'6\r\n{"a":"\r\n'] + [chunk] * (1 << 14)))
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert BODY_LIMIT < sent < 8 * BODY_LIMIT


def test_a_body_under_the_limit_is_served(server: ServerProcess):
    response = httpx.post(f"{server.url}{COMPLETIONS}", json={"prompt": "Hi", "max_tokens": 2, "user": "u" * 1000})
    assert response.status_code == 200, response.text


def test_a_prompt_too_long_for_any_tokenization_is_refused_without_tokenizing(server: ServerProcess):
    # 256 tokens of context, SmolLM2's longest token is 81 characters: 1 MB of text cannot fit.
    prompt = "word " * 190_000
    start = time.monotonic()
    response = httpx.post(f"{server.url}{COMPLETIONS}", json={"prompt": prompt, "max_tokens": 1}, timeout=30)
    elapsed = time.monotonic() - start
    error = assert_openai_error(response, 400, None)
    assert error["param"] == "prompt" and "characters" in error["message"]
    assert elapsed < 1.0, elapsed  # tokenizing it takes several seconds on this machine
    chat = httpx.post(f"{server.url}/v1/chat/completions",
                      json={"messages": [{"role": "user", "content": prompt}], "max_tokens": 1}, timeout=30)
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages"


def test_past_the_queue_bound_requests_get_429_with_retry_after(server: ServerProcess):
    core = server.core_pid
    body = {"prompt": "Hi", "max_tokens": 2}
    os.kill(core, signal.SIGSTOP)  # nothing gets its first token: every admitted request waits
    try:
        async def queue_and_overflow() -> tuple[list[httpx.Response], httpx.Response]:
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                held = [asyncio.create_task(client.post(COMPLETIONS, json=body)) for _ in range(QUEUE_BOUND)]
                deadline = time.monotonic() + 10
                while waiting(server) < QUEUE_BOUND:
                    assert time.monotonic() < deadline, "the requests were never admitted"
                    await asyncio.sleep(0.05)
                before = rejected(server, "queue_full")
                start = time.monotonic()
                refused = await client.post(COMPLETIONS, json=body)
                assert time.monotonic() - start < 1.0
                assert rejected(server, "queue_full") == before + 1
                # Other routes are not queued.
                assert (await client.post("/tokenize", json={"prompt": "Hi"})).status_code == 200
                os.kill(core, signal.SIGCONT)
                return list(await asyncio.gather(*held)), refused

        held, refused = asyncio.run(queue_and_overflow())
    finally:
        os.kill(core, signal.SIGCONT)
    error = assert_openai_error(refused, 429, "server_overloaded")
    assert error["type"] == "server_overloaded" and "overloaded" in error["message"]
    assert int(refused.headers["retry-after"]) >= 1
    assert [r.status_code for r in held] == [200] * QUEUE_BOUND
    assert httpx.post(f"{server.url}{COMPLETIONS}", json=body).status_code == 200


def test_a_burst_of_ten_times_the_bound_gets_only_200_and_429(server: ServerProcess):
    async def burst() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as client:
            return await asyncio.gather(*(client.post(COMPLETIONS, json={"prompt": f"Hi {i}", "max_tokens": 4})
                                          for i in range(10 * QUEUE_BOUND)))

    statuses = [r.status_code for r in asyncio.run(burst())]
    assert set(statuses) <= {200, 429}, statuses
    assert statuses.count(200) >= QUEUE_BOUND and statuses.count(429) >= 1, statuses

