"""AsyncEngine: the asyncio front over an engine core process, on the default model."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from wick import EngineArgs, SamplingParams
from wick.engine.async_engine import AsyncEngine, EngineDeadError
from wick.outputs import RequestOutput

ARGS = dict(max_model_len=1024, num_kv_blocks=48)
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
ENDLESS = SamplingParams(temperature=0.0, max_tokens=1000, ignore_eos=True)


@pytest.fixture(scope="module")
def engine():
    engine = AsyncEngine.from_engine_args(EngineArgs(**ARGS))
    yield engine
    engine.shutdown()


async def _collect(engine: AsyncEngine, request_id: str, prompt: str,
                   params: SamplingParams = GREEDY) -> list[RequestOutput]:
    ids = engine.tokenizer.encode(prompt)
    return [out async for out in engine.generate(request_id, prompt, ids, params)]


async def _wait_until_idle(engine: AsyncEngine, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = engine.stats
        if stats["num_running"] == 0 and stats["num_waiting"] == 0 and stats["num_unfinished_requests"] == 0:
            return stats
        await asyncio.sleep(0.02)
    raise AssertionError(f"the engine did not become idle: {engine.stats}")


def test_attributes(engine):
    assert engine.max_model_len == 1024 and engine.num_kv_blocks == 48 and engine.block_size == 16
    assert engine.model_name == "SmolLM2-135M-Instruct.Q4_1"
    assert engine.eos_token_ids and not engine.is_dead


def test_streams_cumulative_outputs_and_records_metrics(engine):
    engine.take_finished_metrics()
    before = engine.stats
    outputs = asyncio.run(_collect(engine, "stream", "The capital of France is"))
    lengths = [len(o.outputs[0].token_ids) for o in outputs]
    assert lengths == sorted(lengths) and lengths[-1] == 8
    assert [o.finished for o in outputs] == [False] * (len(outputs) - 1) + [True]
    final = outputs[-1].outputs[0]
    assert final.finish_reason == "length"
    assert final.text == engine.tokenizer.decode(final.token_ids, skip_special_tokens=True)
    stats = engine.stats
    assert stats["generation_tokens"] - before["generation_tokens"] == 8
    assert stats["prompt_tokens"] - before["prompt_tokens"] == len(outputs[-1].prompt_token_ids)
    assert stats["finished_by_reason"]["length"] - before["finished_by_reason"].get("length", 0) == 1
    (metrics,) = engine.take_finished_metrics()
    assert metrics.request_id == "stream" and metrics.finish_reason == "length"
    assert metrics.num_generation_tokens == 8
    assert 0 < metrics.time_to_first_token <= metrics.e2e_latency and metrics.time_per_output_token > 0


def test_concurrent_requests_match_each_alone(engine):
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]

    async def alone() -> list[list[int]]:
        return [(await _collect(engine, f"alone-{i}", p))[-1].outputs[0].token_ids for i, p in enumerate(prompts)]

    async def together() -> list[list[int]]:
        runs = await asyncio.gather(*(_collect(engine, f"together-{i}", p) for i, p in enumerate(prompts)))
        return [run[-1].outputs[0].token_ids for run in runs]

    assert asyncio.run(together()) == asyncio.run(alone())


def test_n_samples_and_stop_strings(engine):
    params = SamplingParams(n=2, temperature=1.0, seed=7, max_tokens=4, ignore_eos=True)
    (out,) = asyncio.run(_collect(engine, "n2", "Once upon a time", params))[-1:]
    assert [len(s.token_ids) for s in out.outputs] == [4, 4] and out.finished

    reference = asyncio.run(_collect(engine, "ref", "1, 2, 3, 4,"))[-1].outputs[0].text
    stop = reference.split()[1]
    stopped = asyncio.run(_collect(engine, "stop", "1, 2, 3, 4,", GREEDY.clone(stop=[stop])))[-1].outputs[0]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == stop
    assert stopped.text == reference[:reference.index(stop)]
    assert asyncio.run(_wait_until_idle(engine))["kv_cache_usage"] == 0.0


def test_impossible_prompts_raise_at_once(engine):
    async def first(ids: list[int], params: SamplingParams = GREEDY) -> None:
        await anext(engine.generate("bad", None, ids, params))

    with pytest.raises(ValueError, match="maximum context"):
        asyncio.run(first([1] * 1024))
    with pytest.raises(ValueError, match="KV cache blocks"):
        asyncio.run(first([1] * 800))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        asyncio.run(first([1, 10**6]))
    with pytest.raises(ValueError, match="at least one token"):
        asyncio.run(first([]))
    assert not engine.is_dead
    assert len(asyncio.run(_collect(engine, "bad", "Still alive?"))[-1].outputs[0].token_ids) == 8


def test_closing_or_cancelling_the_stream_aborts_the_request(engine):
    ids = engine.tokenizer.encode("Count with me: one, two, three,")

    async def close_after_first() -> dict:
        stream = engine.generate("closed", None, ids, ENDLESS)
        await anext(stream)
        assert engine.stats["num_running"] == 1
        await stream.aclose()
        return await _wait_until_idle(engine)

    async def cancel_midway() -> dict:
        async def consume() -> None:
            async for _ in engine.generate("cancelled", None, ids, ENDLESS):
                pass

        generated = engine.stats["generation_tokens"]
        task = asyncio.create_task(consume())
        while engine.stats["generation_tokens"] == generated:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await _wait_until_idle(engine)

    assert asyncio.run(close_after_first())["kv_cache_usage"] == 0.0
    assert asyncio.run(cancel_midway())["kv_cache_usage"] == 0.0
    assert engine.stats["finished_by_reason"]["abort"] >= 2


def test_abort_ends_the_stream(engine):
    async def run() -> list[RequestOutput]:
        outputs = []
        async for out in engine.generate("to-abort", None, [1, 2, 3], ENDLESS):
            outputs.append(out)
            await engine.abort("to-abort")
        return outputs

    outputs = asyncio.run(run())
    assert len(outputs) == 1 and not outputs[-1].finished
    assert asyncio.run(_wait_until_idle(engine))["kv_cache_usage"] == 0.0


def test_abort_all_ends_every_stream_and_counts_requests_generating(engine):
    started = engine.num_started

    async def run() -> tuple[list[list[RequestOutput]], int, int]:
        streams = [engine.generate(f"all-{i}", None, [1, 2, 3 + i], ENDLESS) for i in range(3)]
        outputs = [[await anext(stream)] for stream in streams]
        generating = engine.num_generating
        stopped = engine.abort_all()
        for stream, seen in zip(streams, outputs, strict=True):
            seen.extend([out async for out in stream])
        return outputs, generating, stopped

    outputs, generating, stopped = asyncio.run(run())
    assert generating == 3 and stopped == 3
    assert all(not seen[-1].finished for seen in outputs)
    assert engine.num_generating == 0 and engine.num_started == started + 3
    assert asyncio.run(_wait_until_idle(engine))["kv_cache_usage"] == 0.0


def test_killed_core_fails_in_flight_and_new_requests():
    engine = AsyncEngine.from_engine_args(EngineArgs(**ARGS))
    pid = engine.client.process.pid

    async def run() -> None:
        stream = engine.generate("in-flight", None, [1, 2, 3], ENDLESS)
        await anext(stream)
        os.kill(pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(EngineDeadError):
            async for _ in stream:
                pass
        assert time.monotonic() - start < 2.0
        assert engine.is_dead
        with pytest.raises(EngineDeadError):
            await anext(engine.generate("new", None, [1, 2, 3], GREEDY))

    try:
        asyncio.run(run())
    finally:
        engine.shutdown()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_shutdown_leaves_no_child_process(engine):
    pid = engine.client.process.pid
    engine.shutdown()
    assert engine.is_dead and engine.client.process.exitcode == 0
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)

    async def late() -> None:
        await anext(engine.generate("late", None, [1, 2, 3], GREEDY))

    with pytest.raises(EngineDeadError):
        asyncio.run(late())
