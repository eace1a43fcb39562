"""The serving benchmark's clients: one streaming `/v1/completions` request per prompt (token ids, EOS ignored,
usage in the last chunk), sent at a Poisson request rate (inf: all at once) and at most `max_concurrency`
in flight, over one connection each. Times are time.perf_counter() at the moment a network read returns, so a
read that holds several events gives them one time (as vLLM's client does)."""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass
from typing import Any

import httpx
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
    send_at = send_times(len(prompts), load)
    gate = asyncio.Semaphore(load.max_concurrency) if load.max_concurrency else None
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=httpx.Timeout(None),
                                 limits=limits) as client:

        async def one(i: int) -> RequestResult:
            result = RequestResult(len(prompts[i]), output_lens[i])
            body = completion_body(prompts[i], output_lens[i], temperature, i)
            if gate is None:
                return await stream_completion(client, body, result)
            async with gate:
                return await stream_completion(client, body, result)

        start = time.perf_counter()
        tasks = []
        for i, offset in enumerate(send_at):
            delay = start + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
        results = await asyncio.gather(*tasks)
        return list(results), time.perf_counter() - start


async def stream_completion(client: httpx.AsyncClient, body: dict[str, Any], result: RequestResult) -> RequestResult:
    """Fills `result` from one streamed completion. It succeeds when the stream ends with [DONE] after at least
    one chunk of text and a finish reason, and no error event."""
    start = time.perf_counter()
    last_text = start
    finish_reason = None
    done = False
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:300]!r}"
                return result
            pending = b""
            async for data in response.aiter_raw():
                now = time.perf_counter()
                *events, pending = (pending + data).split(b"\n\n")
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
    except (httpx.HTTPError, json.JSONDecodeError, KeyError) as e:
        result.error = f"{type(e).__name__}: {e}"
        return result
    if not (done and result.chunks and finish_reason):
        result.error = f"the stream ended early: [DONE] {done}, {result.chunks} chunks of text, finish {finish_reason}"
        return result
    result.success = True
    return result
