"""EngineCore: the scheduler, the model runner and one step() that joins them. Sees token ids only."""

from __future__ import annotations

import itertools
import logging
import random
from dataclasses import dataclass

from wick.config import EngineConfig
from wick.core.kv_cache_manager import KVCacheManager
from wick.core.scheduler import Scheduler
from wick.core.structured_output import StructuredOutputManager
from wick.engine.request import Request, RequestStatus
from wick.models.config import common_window
from wick.sampling_params import SamplingParams
from wick.worker.model_runner import ModelRunner, TokenLogprobs

logger = logging.getLogger(__name__)


@dataclass
class EngineCoreRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams  # n is already fanned out into one request per sample
    seed: int | None = None
    prefill_leader: str | None = None


@dataclass
class EngineCoreOutput:
    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[TokenLogprobs] | None = None
    new_prompt_logprobs: list[TokenLogprobs] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | None = None  # the stop token id that ended the request, if any
    num_cached_tokens: int = 0


class EngineCore:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.runner = ModelRunner(config)
        num_blocks = self.runner.determine_num_blocks()
        self.runner.initialize_kv_cache(num_blocks)
        self.runner.capture_cuda_graphs()
        tokens = num_blocks * config.block_size
        logger.info("KV cache: %d blocks of %d tokens = %d tokens; %.1f requests of %d tokens fit at once",
                    num_blocks, config.block_size, tokens, tokens / config.max_model_len, config.max_model_len)
        self.kv_cache_manager = KVCacheManager(num_blocks, config.block_size, config.args.enable_prefix_caching,
                                               sliding_window=common_window(config.hf_config))
        self.scheduler = Scheduler(self.kv_cache_manager, config.max_num_seqs, config.max_num_batched_tokens,
                                   config.max_model_len, config.args.enable_chunked_prefill)
        self.structured_output = StructuredOutputManager(config)
        self._rng = random.Random(config.args.seed)
        self._arrivals = itertools.count()

    def add_request(self, request: EngineCoreRequest) -> None:
        """Raises ValueError at once for a request that can never be served."""
        seed = request.seed if request.seed is not None else self._rng.getrandbits(63)
        core_request = Request(request.request_id, request.prompt_token_ids, request.sampling_params, seed,
                               arrival_order=next(self._arrivals), prefill_leader=request.prefill_leader)
        self.structured_output.init_request(core_request)
        self.scheduler.add_request(core_request)

    def abort_requests(self, request_ids: list[str]) -> None:
        self.scheduler.abort(request_ids)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> list[EngineCoreOutput]:
        scheduler_output = self.scheduler.schedule()
        if not scheduler_output.scheduled:
            return []
        result = self.runner.execute_model(scheduler_output, self.structured_output)
        for request_id, entries in result.prompt_logprobs.items():
            request = next(s.request for s in scheduler_output.scheduled if s.request.request_id == request_id)
            request.prompt_logprobs.extend(entries)
        updated = self.scheduler.update_from_output(scheduler_output, result.sampled_token_ids)
        outputs = {}
        for request in updated:
            rid = request.request_id
            logprobs = result.logprobs.get(rid)
            outputs[rid] = EngineCoreOutput(
                rid, [request.output_token_ids[-1]], [logprobs] if logprobs else None,
                result.prompt_logprobs.get(rid), _finish_reason(request), _stop_reason(request),
                request.num_cached_tokens)
        for rid, entries in result.prompt_logprobs.items():
            if rid not in outputs:
                outputs[rid] = EngineCoreOutput(rid, [], new_prompt_logprobs=entries)
        return list(outputs.values())


def _finish_reason(request: Request) -> str | None:
    return request.status.value if request.is_finished else None


def _stop_reason(request: Request) -> int | None:
    if request.status is not RequestStatus.FINISHED_STOPPED:
        return None
    last = request.output_token_ids[-1]
    return last if last in request.sampling_params.stop_token_ids else None
