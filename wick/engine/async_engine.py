"""The API process's engine: an asyncio front over an engine core in its own process.

Tokenization, detokenization and stop strings happen here; the core sees token ids only. Outputs
arrive on the CoreClient's receiver thread, are detokenized there under one lock, and are handed
to each request's asyncio queue on the event loop that called generate().
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from transformers import PreTrainedTokenizerBase

from wick.config import EngineArgs
from wick.engine.core_client import CoreClient, CoreDied, CoreEvent, CoreOutputs, EngineDeadError, RequestError
from wick.engine.output_processor import OutputProcessor, child_seed
from wick.engine.protocol import EngineCoreRequest
from wick.layers.pooler import PoolerConfig
from wick.outputs import EmbeddingOutput, EmbeddingRequestOutput, RequestOutput
from wick.pooling_params import PoolingParams
from wick.sampling_defaults import SamplingDefaults
from wick.sampling_params import SamplingParams
from wick.tokenizer.tokenizer import eos_token_ids, get_tokenizer

T = TypeVar("T")

__all__ = ["AsyncEngine", "EngineDeadError", "RequestMetrics"]

# Finished-request records kept until take_finished_metrics() collects them.
_MAX_PENDING_METRICS = 10_000


@dataclass
class RequestMetrics:
    """Latencies of one finished request, in seconds, measured when the tokens reached this process."""

    request_id: str
    finish_reason: str | None
    num_prompt_tokens: int
    num_generation_tokens: int
    e2e_latency: float
    time_to_first_token: float | None  # None when no token was generated (aborted early)
    time_per_output_token: float | None  # None with fewer than two output tokens


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    child_ids: list[str]
    num_prompt_tokens: int
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    arrival: float = field(default_factory=time.monotonic)
    first_token: float | None = None
    num_generation_tokens: int = 0

    def put(self, item: RequestOutput | list[float] | BaseException | None) -> None:
        """Thread-safe; None ends the stream without an error (an abort()); a list of floats is an embedding."""
        _put_all({self.loop: [(self, item)]})


def _put_all(items: dict[asyncio.AbstractEventLoop, list[tuple[_Stream, Any]]]) -> None:
    """Puts each item into its stream's queue: one call into each other loop for all of its items (a call
    wakes the loop, a system call each: once per step, not once per request and step)."""
    running = _running_loop()
    for loop, pairs in items.items():
        if loop is running:
            _put_now(pairs)
            continue
        try:
            loop.call_soon_threadsafe(_put_now, pairs)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass


def _put_now(pairs: list[tuple[_Stream, Any]]) -> None:
    for stream, item in pairs:
        stream.queue.put_nowait(item)


class AsyncEngine:
    """Use `AsyncEngine.from_engine_args(args)`; call `shutdown()` when done."""

    def __init__(self, engine_args: EngineArgs) -> None:
        self.engine_args = engine_args
        config = engine_args.create_engine_config()
        source = config.source
        self.model_name: str = engine_args.model or Path(source.path).stem
        self.tokenizer: PreTrainedTokenizerBase = get_tokenizer(
            source.tokenizer_path or source.path, gguf_file=source.gguf_file,
            trust_remote_code=engine_args.trust_remote_code)
        self.eos_token_ids: list[int] = eos_token_ids(self.tokenizer, config.hf_config)
        # Set for an embedding model: it serves embed() only; None: generate() only.
        self.pooler_config: PoolerConfig | None = config.pooler_config
        self.sampling_defaults = SamplingDefaults.resolve(source, engine_args.generation_config,
                                                          engine_args.override_generation_config)
        self.output_processor = OutputProcessor(self.tokenizer)
        self._lock = threading.Lock()
        self._streams: dict[str, _Stream] = {}
        self._parent_of: dict[str, str] = {}  # core request id -> request id
        self._core_stats: dict[str, Any] = {
            "num_running": 0, "num_waiting": 0, "kv_cache_usage": 0.0,
            "prefix_cache_queries": 0, "prefix_cache_hits": 0, "num_preemptions": 0}
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._num_generating = 0  # requests that have their first token and are not finished
        self._num_started = 0
        self._finished = Counter[str]()
        self._metrics: deque[RequestMetrics] = deque(maxlen=_MAX_PENDING_METRICS)
        self.client = CoreClient(engine_args, self._on_event)
        info = self.client.info
        self.max_model_len: int = info.max_model_len
        self.num_kv_blocks: int = info.num_kv_blocks
        self.block_size: int = info.block_size
        self.vocab_size: int = info.vocab_size

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> AsyncEngine:
        return cls(engine_args)

    @property
    def is_dead(self) -> bool:
        return self.client.is_dead

    @property
    def stats(self) -> dict[str, Any]:
        """The core's latest figures and this front end's counters, all cumulative since start."""
        with self._lock:
            return {
                **self._core_stats,
                "num_unfinished_requests": len(self._streams),
                "prompt_tokens": self._prompt_tokens,
                "generation_tokens": self._generation_tokens,
                "finished_requests": sum(self._finished.values()),
                "finished_by_reason": dict(self._finished),
            }

    @property
    def num_generating(self) -> int:
        """Requests that have produced their first token and have not finished."""
        return self._num_generating

    @property
    def num_started(self) -> int:
        """Requests that have produced their first token, since start."""
        return self._num_started

    def take_finished_metrics(self) -> list[RequestMetrics]:
        """The records of the requests finished since the last call (at most the last 10,000)."""
        with self._lock:
            taken = list(self._metrics)
            self._metrics.clear()
        return taken

    async def generate(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                       params: SamplingParams) -> AsyncIterator[RequestOutput]:
        """Yields the request's cumulative output each time it grows, the last one `finished`.

        Raises ValueError at once for a request that can never be served, EngineDeadError when the
        core is gone. Closing or cancelling the iterator aborts the request in the core.
        """
        self._validate(prompt_token_ids, params)
        params = params.clone(eos_token_ids=self.eos_token_ids)
        with self._lock:
            if self.is_dead:
                raise EngineDeadError(self.client.dead_reason)
            child_ids = self.output_processor.add_request(request_id, prompt, prompt_token_ids, params)
            stream = _Stream(asyncio.get_running_loop(), child_ids, len(prompt_token_ids))
            self._streams[request_id] = stream
            self._parent_of.update((child_id, request_id) for child_id in child_ids)
        finished = False
        try:
            child_params = params.clone(n=1) if params.n > 1 else params
            for i, child_id in enumerate(child_ids):
                self.client.add_request(EngineCoreRequest(
                    child_id, prompt_token_ids, child_params, child_seed(params.seed, i),
                    prefill_leader=child_ids[0] if i else None))
            while not finished:
                item = await stream.queue.get()
                # Outputs are cumulative, so a slow reader needs only the last; an end or error comes first.
                while isinstance(item, RequestOutput) and not stream.queue.empty():
                    item = stream.queue.get_nowait()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:
                self._abort(request_id)

    async def embed(self, request_id: str, prompt_token_ids: list[int],
                    params: PoolingParams) -> EmbeddingRequestOutput | None:
        """The prompt's embedding, or None when abort() stopped the request. Raises ValueError at once for a
        request that can never be served, EngineDeadError when the core is gone. Cancelling aborts it in the core."""
        if self.pooler_config is None:
            raise ValueError("this model generates text: it serves no embeddings")
        self.pooler_config.check(params)
        self._validate_tokens(prompt_token_ids, self.max_model_len, "length")
        with self._lock:
            if self.is_dead:
                raise EngineDeadError(self.client.dead_reason)
            if request_id in self._streams:
                raise ValueError(f"request id {request_id!r} is already in use")
            stream = _Stream(asyncio.get_running_loop(), [request_id], len(prompt_token_ids))
            self._streams[request_id] = stream
            self._parent_of[request_id] = request_id
        finished = False
        try:
            self.client.add_request(EngineCoreRequest(request_id, prompt_token_ids, SamplingParams(max_tokens=1),
                                                      pooling_params=params))
            item = await stream.queue.get()
            if isinstance(item, BaseException):
                raise item
            finished = True
            if item is None:
                return None
            return EmbeddingRequestOutput(request_id, EmbeddingOutput(item), prompt_token_ids)
        finally:
            if not finished:
                self._abort(request_id)

    async def abort(self, request_id: str) -> None:
        """Stops a request; its generate() iterator ends without a final output."""
        stream = self._abort(request_id)
        if stream is not None:
            stream.put(None)

    def abort_all(self) -> int:
        """Stops every request (as abort() does); returns how many there were."""
        with self._lock:
            request_ids = list(self._streams)
        for request_id in request_ids:
            stream = self._abort(request_id)
            if stream is not None:
                stream.put(None)
        return len(request_ids)

    def shutdown(self) -> None:
        """Stops the core process; generate() raises EngineDeadError from now on."""
        self.client.shutdown()

    def _validate(self, token_ids: list[int], params: SamplingParams) -> None:
        num_tokens = len(token_ids)
        self._validate_tokens(token_ids, self.max_model_len - 1, "context")
        num_blocks = -(-(num_tokens + 1) // self.block_size)
        if num_blocks > self.num_kv_blocks:
            raise ValueError(f"prompt has {num_tokens} tokens; with one generated token it needs {num_blocks} "
                             f"KV cache blocks of {self.block_size} tokens, but the cache holds only "
                             f"{self.num_kv_blocks} blocks ({self.num_kv_blocks * self.block_size} tokens)")
        for what, ids in (("stop_token_ids", params.stop_token_ids), ("logit_bias", list(params.logit_bias or {}))):
            self._check_vocabulary(what, ids)

    def _validate_tokens(self, token_ids: list[int], max_tokens: int, what: str) -> None:
        if not token_ids:
            raise ValueError("the prompt must contain at least one token")
        if len(token_ids) > max_tokens:
            raise ValueError(f"prompt has {len(token_ids)} tokens; the model's maximum {what} is "
                             f"{self.max_model_len} tokens")
        self._check_vocabulary("prompt", token_ids)

    def _check_vocabulary(self, what: str, ids: list[int] | None) -> None:
        bad = next((t for t in ids or [] if not 0 <= int(t) < self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"{what} holds token id {bad}, outside the vocabulary of {self.vocab_size} tokens")

    def _abort(self, request_id: str) -> _Stream | None:
        with self._lock:
            stream = self._streams.get(request_id)
            if stream is not None:
                self._finish(request_id, stream, "abort")
            core_ids = self.output_processor.abort_request(request_id)
        self.client.abort_requests(core_ids)
        return stream

    def _finish(self, request_id: str, stream: _Stream, reason: str | None) -> None:
        """Forgets a request and records its metrics; called with the lock held."""
        del self._streams[request_id]
        for child_id in stream.child_ids:
            self._parent_of.pop(child_id, None)
        now = time.monotonic()
        ttft = tpot = None
        if stream.first_token is not None:
            self._num_generating -= 1
            ttft = stream.first_token - stream.arrival
            if stream.num_generation_tokens > 1:
                tpot = (now - stream.first_token) / (stream.num_generation_tokens - 1)
        self._finished[reason or "abort"] += 1
        self._metrics.append(RequestMetrics(request_id, reason, stream.num_prompt_tokens,
                                            stream.num_generation_tokens, now - stream.arrival, ttft, tpot))

    def _on_event(self, event: CoreEvent) -> None:
        """Runs on the CoreClient's receiver thread."""
        if isinstance(event, CoreOutputs):
            self._on_outputs(event)
        elif isinstance(event, RequestError):
            with self._lock:
                request_id = self._parent_of.get(event.request_id)
                stream = self._streams.get(request_id) if request_id is not None else None
            if stream is not None:
                self._abort(request_id)
                stream.put(ValueError(event.message))
        elif isinstance(event, CoreDied):
            with self._lock:
                streams = list(self._streams.values())
            for stream in streams:
                stream.put(EngineDeadError(event.reason))

    def _on_outputs(self, event: CoreOutputs) -> None:
        deliveries: dict[asyncio.AbstractEventLoop, list[tuple[_Stream, Any]]] = {}
        with self._lock:
            self._core_stats = event.stats
            now = time.monotonic()
            for out in event.outputs:
                stream = self._streams.get(self._parent_of.get(out.request_id, ""))
                if stream is not None and out.pooling_output is not None:
                    self._prompt_tokens += stream.num_prompt_tokens
                    self._finish(out.request_id, stream, out.finish_reason)
                    deliveries.setdefault(stream.loop, []).append((stream, out.pooling_output))
                    continue
                if stream is None or not out.new_token_ids:
                    continue
                if stream.first_token is None:
                    stream.first_token = now
                    self._prompt_tokens += stream.num_prompt_tokens
                    self._num_generating += 1
                    self._num_started += 1
                stream.num_generation_tokens += len(out.new_token_ids)
                self._generation_tokens += len(out.new_token_ids)
            outputs, to_abort = self.output_processor.process_outputs(event.outputs)
            for output in outputs:
                stream = self._streams.get(output.request_id)
                if stream is None:
                    continue
                if output.finished:
                    self._finish(output.request_id, stream, output.outputs[0].finish_reason)
                deliveries.setdefault(stream.loop, []).append((stream, _snapshot(output)))
        _put_all(deliveries)
        # Samples ended by a stop string: the core would otherwise keep generating them.
        self.client.abort_requests(to_abort)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _shallow_copy(obj: T) -> T:
    copy = object.__new__(type(obj))
    copy.__dict__.update(obj.__dict__)
    return copy


def _snapshot(output: RequestOutput) -> RequestOutput:
    """`output` made safe from later steps: the output processor extends its samples' lists in place, so they
    are copied (shallow copies with their lists replaced: dataclasses.replace costs several times more, once
    per token). The RequestOutput itself is the processor's new one of this step, changed in place."""
    samples = []
    for sample in output.outputs:
        copy = _shallow_copy(sample)
        copy.token_ids = list(sample.token_ids)
        if sample.logprobs is not None:
            copy.logprobs = list(sample.logprobs)
        samples.append(copy)
    output.outputs = samples
    if output.prompt_logprobs is not None:
        output.prompt_logprobs = list(output.prompt_logprobs)
    return output
