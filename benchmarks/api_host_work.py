"""The API process's own work, on the CPU, without a GPU or an engine core: taking in one completion request
(reading the body as `parse_body` does, checking the token ids) and handing out one engine step's outputs
(merging steps that waited, detokenizing, snapshots for the streams) for a batch of streams.

    python -m benchmarks.api_host_work --tokenizer build/qwen-tokenizer
    python -m benchmarks.api_host_work --tokenizer build/qwen-tokenizer --prompt-len 560 --batch 256 --merged 1 4

Per request and per step, microseconds, the fastest of several tries: what one event loop and one receiver
thread spend under one GIL while `benchmarks.serve` runs the same shapes (a prompt of token ids, 256 streams, one
token a step). The CPU machine's timings vary by a third from run to run: compare within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections.abc import Callable

from starlette.requests import Request

from benchmarks.common import environment
from wick.engine.async_engine import _snapshot
from wick.engine.core_process import decode_output, encode_output, pack, unpack
from wick.engine.output_processor import OutputProcessor
from wick.engine.protocol import EngineCoreOutput, merge_step_outputs
from wick.entrypoints.openai.api_server import parse_body
from wick.entrypoints.openai.protocol import CompletionRequest
from wick.sampling_params import SamplingParams
from wick.tokenizer.tokenizer import get_tokenizer


def _us(fn: Callable[[], object], repeats: int) -> float:
    """The fastest of `repeats` calls (this machine's other work only ever adds time)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e6


def _request(body: bytes) -> Request:
    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}
    return Request(scope, receive)


def take_in(tokenizer, prompt_len: int, repeats: int) -> dict[str, float]:
    prompt = list(range(1000, 1000 + prompt_len))
    body = json.dumps({"prompt": prompt, "max_tokens": 512, "temperature": 0.6, "seed": 1, "ignore_eos": True,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    loop = asyncio.new_event_loop()
    try:
        parse = _us(lambda: loop.run_until_complete(parse_body(_request(body), CompletionRequest)), repeats)
    finally:
        loop.close()
    return {"parse_body": parse, "decode the prompt (an echo's text)": _us(lambda: tokenizer.decode(prompt), repeats)}


def hand_out(tokenizer, batch: int, merged: int, steps: int, output_len: int) -> float:
    """Microseconds per engine step: `steps` steps of `batch` streams, taken `merged` at a time."""
    processor = OutputProcessor(tokenizer)
    for i in range(batch):
        processor.add_request(str(i), None, [1, 2, 3], SamplingParams(max_tokens=output_len, ignore_eos=True))
    rng = random.Random(0)
    messages = [pack(["outputs", [encode_output(EngineCoreOutput(str(i), [rng.randrange(1000, 30000)]))
                                  for i in range(batch)], {}]) for _ in range(steps)]
    start = time.perf_counter()
    for first in range(0, steps, merged):
        group = [[decode_output(o) for o in unpack(m)[1]] for m in messages[first:first + merged]]
        outputs = group[0] if merged == 1 else merge_step_outputs(group)
        results, _ = processor.process_outputs(outputs)
        for output in results:
            _snapshot(output)
    return (time.perf_counter() - start) / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--prompt-len", type=int, default=560)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=512, help="steps handed out, each stream's tokens so far")
    parser.add_argument("--merged", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--repeats", type=int, default=200, help="requests taken in, per figure")
    parser.add_argument("--trials", type=int, default=5, help="hand-out runs per figure; the fastest is printed")
    args = parser.parse_args()
    print(" | ".join(f"{k} {v}" for k, v in environment().items()))
    tokenizer = get_tokenizer(args.tokenizer)
    for name, us in take_in(tokenizer, args.prompt_len, args.repeats).items():
        print(f"take in a request of {args.prompt_len} token ids, {name}: {us:,.0f} us")
    for merged in args.merged:
        us = min(hand_out(tokenizer, args.batch, merged, args.steps, args.steps) for _ in range(args.trials))
        print(f"hand out a step of {args.batch} streams ({args.steps} steps, {merged} merged at a time): "
              f"{us:,.0f} us a step, {us / args.batch:.1f} us a token")


if __name__ == "__main__":
    main()
