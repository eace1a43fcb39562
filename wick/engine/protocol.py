"""What the front end and the engine core exchange: requests in, per-step outputs back.

No torch and no model code is imported here, so the API server process never loads them.
"""

from __future__ import annotations

from dataclasses import dataclass

from wick.pooling_params import PoolingParams
from wick.sampling_params import SamplingParams

# (token ids, logprobs, rank of the first id): the chosen token first, then the top-N alternatives.
TokenLogprobs = tuple[list[int], list[float], int]


@dataclass
class EngineCoreRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams  # n is already fanned out into one request per sample
    seed: int | None = None
    prefill_leader: str | None = None
    # Set for an embedding request: the prompt is computed, pooled, and the request finishes (no token sampled).
    pooling_params: PoolingParams | None = None


@dataclass
class EngineCoreOutput:
    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[TokenLogprobs] | None = None
    new_prompt_logprobs: list[TokenLogprobs] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | None = None  # the stop token id that ended the request, if any
    num_cached_tokens: int = 0
    pooling_output: list[float] | None = None  # an embedding request's embedding, with finish_reason "stop"
