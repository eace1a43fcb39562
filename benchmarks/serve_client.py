"""The serving benchmark's clients: one streaming `/v1/completions` request per prompt (token ids, EOS ignored,
usage in the last chunk), sent at a Poisson request rate (inf: all at once) and at most `max_concurrency`
in flight, over one connection each. Times are time.perf_counter() at the moment a network read returns, so a
read that holds several events gives them one time (as vLLM's client does).

The client speaks HTTP/1.1 over asyncio's own streams rather than through an HTTP library: it shares the
machine with the server, and its own time counts in the run's duration. Sending 256 requests at once through httpx,
the first of them reached the engine core 248-340 ms after the start, and all of them by 325-437 ms; through this
client 46-56 ms and 159-184 ms (session 32, docs/benchmarks.md)."""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from benchmarks.serve_metrics import RequestResult


@dataclass(frozen=True)
class Load:
    request_rate: float = math.inf  # requests per second, exponential gaps between them
    max_concurrency: int | None = None
    seed: int = 0


def completion_body(prompt: list[int], output_len: int, temperature: float, seed: int) -> dict[str, Any]:
    return {"prompt": prompt, "max_tokens": output_len, "temperature": temperature, "seed": seed,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


def send_times(num_requests: int, load: Load) -> list[float]:
    """Seconds after the start at which each request is sent: the first at once, then exponential gaps of mean
    1 / request_rate (a Poisson process); all at once when the rate is inf."""
    if math.isinf(load.request_rate):
        return [0.0] * num_requests
    gaps = np.random.default_rng(load.seed).exponential(1 / load.request_rate, num_requests)
    gaps[0] = 0.0
    return np.cumsum(gaps).tolist()


async def run_load(base_url: str, prompts: list[list[int]], output_lens: list[int], temperature: float, load: Load,
                   api_key: str | None = None) -> tuple[list[RequestResult], float]:
    """Sends every prompt (request i samples with seed i, as benchmarks/throughput.py does); returns the results
    in prompt order and the seconds from the first request sent to the last answer received."""
    server = Server.of(base_url, api_key)
    send_at = send_times(len(prompts), load)
    gate = asyncio.Semaphore(load.max_concurrency) if load.max_concurrency else None

    async def one(i: int) -> RequestResult:
        result = RequestResult(len(prompts[i]), output_lens[i])
        body = completion_body(prompts[i], output_lens[i], temperature, i)
        if gate is None:
            return await stream_completion(server, body, result)
        async with gate:
            return await stream_completion(server, body, result)

    start = time.perf_counter()
    tasks = []
    for i, offset in enumerate(send_at):
        delay = start + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    results = await asyncio.gather(*tasks)
    return list(results), time.perf_counter() - start


@dataclass(frozen=True)
class Server:
    host: str
    port: int
    headers: bytes  # the request headers every request carries, after its request line

    @classmethod
    def of(cls, base_url: str, api_key: str | None = None) -> Server:
        url = urlsplit(base_url)
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"the serving benchmark talks plain HTTP to a host: {base_url!r}")
        port = url.port or 80
        host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
        headers = f"Host: {host}:{port}\r\nContent-Type: application/json\r\nConnection: close\r\n"
        if api_key:
            headers += f"Authorization: Bearer {api_key}\r\n"
        return cls(url.hostname, port, headers.encode())

    def post(self, path: str, body: dict[str, Any]) -> bytes:
        payload = json.dumps(body).encode()
        return b"POST %s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n%s" % (path.encode(), self.headers, len(payload),
                                                                             payload)


class Dechunker:
    """The body of a response in HTTP/1.1's chunked transfer coding, as its bytes arrive."""

    def __init__(self) -> None:
        self._pending = b""
        self.ended = False

    def feed(self, data: bytes) -> bytes:
        """The body's bytes that `data` completes."""
        self._pending += data
        out = []
        while not self.ended:
            line_end = self._pending.find(b"\r\n")
            if line_end < 0:
                break
            size = int(self._pending[:line_end].split(b";", 1)[0], 16)
            chunk_end = line_end + 2 + size
            if len(self._pending) < chunk_end + 2:
                break
            out.append(self._pending[line_end + 2:chunk_end])
            self._pending = self._pending[chunk_end + 2:]
            self.ended = size == 0
        return b"".join(out)


async def stream_completion(server: Server, body: dict[str, Any], result: RequestResult) -> RequestResult:
    """Fills `result` from one streamed completion. It succeeds when the stream ends with [DONE] after at least
    one chunk of text and a finish reason, and no error event."""
    start = time.perf_counter()
    last_text = start
    finish_reason = None
    done = False
    writer = None
    try:
        reader, writer = await asyncio.open_connection(server.host, server.port)
        writer.write(server.post("/v1/completions", body))
        status_line = await reader.readline()
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(status_line.split(b" ", 2)[1])
        if status != 200:
            result.error = f"HTTP {status}: {(await reader.read())[:300]!r}"
            return result
        if b"transfer-encoding: chunked" not in head.lower():
            result.error = f"a stream without chunked transfer coding: {head[:300]!r}"
            return result
        dechunker = Dechunker()
        pending = b""
        while not dechunker.ended:
            data = await reader.read(1 << 16)
            if not data:
                break
            now = time.perf_counter()
            *events, pending = (pending + dechunker.feed(data)).split(b"\n\n")
            for event in events:
                payload = event.strip().removeprefix(b"data:").strip()
                if not payload or payload.startswith(b":"):
                    continue
                if payload == b"[DONE]":
                    done = True
                    continue
                chunk = json.loads(payload)
                if "error" in chunk:
                    result.error = f"error event: {chunk['error']}"
                    return result
                for choice in chunk.get("choices") or ():
                    if choice.get("text"):
                        if result.chunks == 0:
                            result.ttft = now - start
                        else:
                            result.itl.append(now - last_text)
                        last_text = now
                        result.chunks += 1
                    finish_reason = choice.get("finish_reason") or finish_reason
                    result.latency = now - start
                if chunk.get("usage"):
                    result.output_tokens = chunk["usage"]["completion_tokens"]
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, KeyError, IndexError) as e:
        result.error = f"{type(e).__name__}: {e}"
        return result
    finally:
        if writer is not None:
            writer.close()
    if not (done and result.chunks and finish_reason):
        result.error = f"the stream ended early: [DONE] {done}, {result.chunks} chunks of text, finish {finish_reason}"
        return result
    result.success = True
    return result
