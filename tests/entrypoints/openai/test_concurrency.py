"""Many streaming clients at once, and clients that go away mid-request."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import openai
from wick_server import metric

NUM_CLIENTS = 64
MAX_TOKENS = 4


def test_many_concurrent_streams_all_finish_with_right_usage(async_client: openai.AsyncOpenAI):
    async def one(i: int) -> tuple[str, openai.types.CompletionUsage, list[str]]:
        stream = await async_client.chat.completions.create(
            model="", messages=[{"role": "user", "content": f"Count from {i} to {i + 10}."}], max_tokens=MAX_TOKENS,
            stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        text, usage, finishes = "", None, []
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                text += choice.delta.content or ""
                if choice.finish_reason:
                    finishes.append(choice.finish_reason)
        return text, usage, finishes

    async def all_clients() -> list[tuple[str, openai.types.CompletionUsage, list[str]]]:
        return await asyncio.gather(*(one(i) for i in range(NUM_CLIENTS)))

    results = asyncio.run(all_clients())
    assert len(results) == NUM_CLIENTS
    for text, usage, finishes in results:
        assert finishes == ["length"] and text
        assert usage.completion_tokens == MAX_TOKENS and usage.prompt_tokens > 0
        assert usage.total_tokens == usage.prompt_tokens + MAX_TOKENS


def wait_until_idle(http: httpx.Client, timeout: float) -> float:
    """Seconds until no request runs and no KV block is in use."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if metric(http, "wick:kv_cache_usage_perc") == 0 and metric(http, "wick:num_requests_running") == 0:
            return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(f"KV cache still in use {timeout}s after the client left")


def test_client_leaving_a_stream_frees_its_kv_blocks(server, http: httpx.Client):
    wait_until_idle(http, 30)
    body = {"prompt": "Tell me a very long story.", "max_tokens": 1500, "stream": True, "ignore_eos": True}
    with httpx.Client(base_url=server.url, headers=http.headers, timeout=60) as leaving:
        with leaving.stream("POST", "/v1/completions", json=body) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))
            assert metric(http, "wick:kv_cache_usage_perc") > 0
            assert metric(http, "wick:num_requests_running") == 1
    assert wait_until_idle(http, 5) < 2.0


def test_client_leaving_a_non_streaming_request_frees_its_kv_blocks(server, http: httpx.Client):
    wait_until_idle(http, 30)
    body = json.dumps({"prompt": "Tell me a very long story.", "max_tokens": 1500, "ignore_eos": True}).encode()
    url = httpx.URL(server.url)
    with socket.create_connection((url.host, url.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: wick\r\nContent-Type: application/json\r\n"
                     + f"Authorization: {http.headers['Authorization']}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                     + body)
        deadline = time.monotonic() + 30
        while metric(http, "wick:num_requests_running") == 0:
            assert time.monotonic() < deadline, "the request never started"
            time.sleep(0.05)
    assert wait_until_idle(http, 5) < 2.0
