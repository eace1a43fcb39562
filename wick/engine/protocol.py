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


def merge_step_outputs(steps: list[list[EngineCoreOutput]]) -> list[EngineCoreOutput]:
    """Consecutive steps' outputs as one step's: each request's new tokens (and logprobs) in order, once, where
    the request was first seen, with the latest finish. A reader that fell behind catches up in one pass."""
    merged: dict[str, EngineCoreOutput] = {}
    result: list[EngineCoreOutput] = []
    for outputs in steps:
        for out in outputs:
            into = merged.get(out.request_id)
            if into is None or into.finish_reason is not None or into.pooling_output is not None:
                into = merged[out.request_id] = EngineCoreOutput(
                    out.request_id, list(out.new_token_ids), _copy(out.new_logprobs), _copy(out.new_prompt_logprobs),
                    out.finish_reason, out.stop_reason, out.num_cached_tokens, out.pooling_output)
                result.append(into)
                continue
            into.new_token_ids.extend(out.new_token_ids)
            into.new_logprobs = _concat(into.new_logprobs, out.new_logprobs)
            into.new_prompt_logprobs = _concat(into.new_prompt_logprobs, out.new_prompt_logprobs)
            into.finish_reason, into.stop_reason = out.finish_reason, out.stop_reason
            into.num_cached_tokens = max(into.num_cached_tokens, out.num_cached_tokens)
            into.pooling_output = out.pooling_output
    return result


def _copy(entries: list[TokenLogprobs] | None) -> list[TokenLogprobs] | None:
    return None if entries is None else list(entries)


def _concat(first: list[TokenLogprobs] | None, then: list[TokenLogprobs] | None) -> list[TokenLogprobs] | None:
    if then is None:
        return first
    return list(then) if first is None else first + then
