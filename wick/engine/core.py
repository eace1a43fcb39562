"""EngineCore: the scheduler, the model runner and one step() that joins them. Sees token ids only."""

from __future__ import annotations

import itertools
import logging
import random
from collections import deque

from wick.config import EngineConfig
from wick.core.kv_cache_manager import KVCacheManager
from wick.core.request import Request, RequestStatus
from wick.core.sched_output import ModelRunnerOutput, SchedulerOutput
from wick.core.scheduler import Scheduler
from wick.core.structured_output import StructuredOutputManager
from wick.engine.protocol import EngineCoreOutput, EngineCoreRequest
from wick.executor import create_executor
from wick.models.config import common_window
from wick.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class EngineCore:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.executor = create_executor(config)
        try:
            num_blocks = self.executor.determine_num_blocks()
            self.executor.initialize_kv_cache(num_blocks)
            self.executor.warm_up()
        except BaseException:
            self.executor.shutdown()
            raise
        tokens = num_blocks * config.block_size
        logger.info("KV cache: %d blocks of %d tokens = %d tokens; %.1f requests of %d tokens fit at once",
                    num_blocks, config.block_size, tokens, tokens / config.max_model_len, config.max_model_len)
        self.kv_cache_manager = KVCacheManager(num_blocks, config.block_size, config.args.enable_prefix_caching,
                                               sliding_window=common_window(config.hf_config))
        self.scheduler = Scheduler(self.kv_cache_manager, config.max_num_seqs, config.max_num_batched_tokens,
                                   config.max_model_len, config.args.enable_chunked_prefill)
        self.structured_output = StructuredOutputManager(config)
        self.vocab_size = config.hf_config.vocab_size
        self._rng = random.Random(config.args.seed)
        self._arrivals = itertools.count()
        # Steps launched whose outputs have not been processed yet (at most one, with overlap).
        self._in_flight: deque[SchedulerOutput] = deque()
        # Unfinished requests that need every step's token on the host before the next step.
        self._sync_ids: set[str] = set()

    def add_request(self, request: EngineCoreRequest) -> None:
        """Raises ValueError at once for a request that can never be served."""
        seed = request.seed if request.seed is not None else self._rng.getrandbits(63)
        core_request = Request(request.request_id, request.prompt_token_ids, request.sampling_params, seed,
                               arrival_order=next(self._arrivals), prefill_leader=request.prefill_leader,
                               pooling_params=request.pooling_params)
        self.structured_output.init_request(core_request)
        self.scheduler.add_request(core_request)
        if core_request.structured_output is not None or _uses_penalties(request.sampling_params):
            self._sync_ids.add(request.request_id)

    def abort_requests(self, request_ids: list[str]) -> None:
        self.scheduler.abort(request_ids)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> list[EngineCoreOutput]:
        """Schedules and launches a step; returns the outputs of the step that finished. With overlapped
        scheduling that is the previous one (the first step returns none): the host schedules step N+1
        while the device runs step N. Requests whose next step needs step N's token on the host (grammar
        masks, penalties) make the engine wait for it first."""
        if self._sync_ids:
            self._sync_ids &= self.scheduler.requests.keys()
        overlap = self.config.async_scheduling and not self._sync_ids
        if self._in_flight and not overlap:
            return self._finish_in_flight()
        scheduler_output = self.scheduler.schedule()
        if not scheduler_output.num_scheduled_tokens:
            return self._finish_in_flight() if self._in_flight else []
        if overlap:
            self.executor.execute_and_sample_async(scheduler_output)
            self._in_flight.append(scheduler_output)
            return self._finish_in_flight() if len(self._in_flight) > 1 else []
        requests = self.scheduler.requests
        samplers = [requests[rid] for rid in scheduler_output.num_scheduled_tokens
                    if requests[rid].num_output_placeholders]
        if self.structured_output.any_active(samplers):
            self.executor.execute_model(scheduler_output)
            # On a GPU the forward is running now: the grammar masks fill on the CPU meanwhile.
            result = self.executor.sample_tokens(self.structured_output.fill_bitmask(samplers))
        else:
            result = self.executor.execute_and_sample(scheduler_output)
        return self._process(scheduler_output, result)

    def _finish_in_flight(self) -> list[EngineCoreOutput]:
        return self._process(self._in_flight.popleft(), self.executor.take_output())

    def _process(self, scheduler_output: SchedulerOutput, result: ModelRunnerOutput) -> list[EngineCoreOutput]:
        requests = self.scheduler.requests
        starts = scheduler_output.starts
        prompt_logprobs = {}
        for rid, entries in result.prompt_logprobs.items():
            request = requests.get(rid)
            if request is None:
                continue
            # After a preemption the prompt is computed again: keep only positions not reported yet.
            new = entries[max(0, len(request.prompt_logprobs) - starts[rid]):]
            if new:
                request.prompt_logprobs.extend(new)
                prompt_logprobs[rid] = new
        updated = self.scheduler.update_from_output(scheduler_output, result)
        outputs = {}
        for request in updated:
            rid = request.request_id
            logprobs = result.logprobs.get(rid)
            outputs[rid] = EngineCoreOutput(
                rid, [request.output_token_ids[-1]], [logprobs] if logprobs else None,
                prompt_logprobs.get(rid), _finish_reason(request), _stop_reason(request),
                request.num_cached_tokens)
        for rid, embedding in result.pooler_output.items():
            outputs[rid] = EngineCoreOutput(rid, [], finish_reason="stop", pooling_output=embedding)
        for rid, entries in prompt_logprobs.items():
            if rid not in outputs:
                outputs[rid] = EngineCoreOutput(rid, [], new_prompt_logprobs=entries)
        return list(outputs.values())

    def shutdown(self) -> None:
        self.executor.shutdown()


def _uses_penalties(params: SamplingParams) -> bool:
    return (params.repetition_penalty != 1.0 or params.presence_penalty != 0.0
            or params.frequency_penalty != 0.0)


def _finish_reason(request: Request) -> str | None:
    return request.status.value if request.is_finished else None


def _stop_reason(request: Request) -> int | None:
    if request.status is not RequestStatus.FINISHED_STOPPED:
        return None
    last = request.output_token_ids[-1]
    return last if last in request.sampling_params.stop_token_ids else None
