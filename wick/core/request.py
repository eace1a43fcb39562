"""A request's state inside the engine core: token ids, progress, KV blocks, status."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from wick.pooling_params import PoolingParams
from wick.sampling_params import SamplingParams

if TYPE_CHECKING:
    from wick.core.structured_output import RequestGrammar


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH,
                        RequestStatus.FINISHED_ABORTED)


class Request:
    """One sequence. `n > 1` is fanned out into several Requests before it reaches the core.

    `seed` is always set (the engine draws one when the user gave none) so that sampling is a
    pure function of (seed, output position) and survives preemption and batching unchanged.
    """

    def __init__(self, request_id: str, prompt_token_ids: list[int], sampling_params: SamplingParams,
                 seed: int, arrival_order: int = 0, prefill_leader: str | None = None,
                 pooling_params: PoolingParams | None = None) -> None:
        if not prompt_token_ids:
            raise ValueError("the prompt must contain at least one token")
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.seed = seed
        self.arrival_order = arrival_order
        # Another request with the same prompt whose prefill we wait for, so that we find its
        # blocks in the prefix cache instead of computing them again (n > 1).
        self.prefill_leader = prefill_leader
        # An embedding request: finishes once its prompt is computed, with its pooled hidden states.
        self.pooling_params = pooling_params
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        # Tokens sampled by steps in flight that have not reached the scheduler yet: with overlapped
        # scheduling the next step is scheduled as if they were there.
        self.num_output_placeholders = 0
        self.block_ids: list[int] = []
        # Hashes of this request's full blocks, in order; filled by the KV cache manager.
        self.block_hashes: list[bytes] = []
        self.num_cached_tokens = 0
        self.num_preemptions = 0
        # Prompt logprobs collected chunk by chunk: one entry per prompt position after the first.
        self.prompt_logprobs: list = []
        # The grammar matcher of a request with structured_outputs; set by the engine core.
        self.structured_output: RequestGrammar | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, status={self.status.value}, prompt={self.num_prompt_tokens}, "
                f"output={self.num_output_tokens}, computed={self.num_computed_tokens}, "
                f"placeholders={self.num_output_placeholders})")
