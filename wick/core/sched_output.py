"""The step contract between the scheduler and the workers: plain data, no live objects.

A request's data travels once, when it is scheduled for the first time (or again after a
preemption, when the worker has forgotten it); after that a step carries only what changed: the
blocks allocated this step and how far the request has been computed. Each worker keeps its own
copy of every running request (token ids, settings, block table) and appends the tokens it samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch

from wick.engine.protocol import TokenLogprobs
from wick.pooling_params import PoolingParams
from wick.sampling_params import SamplingParams


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list[int]
    # Tokens generated before a preemption; the worker recomputes them with the prompt.
    output_token_ids: list[int]
    sampling_params: SamplingParams
    seed: int
    block_ids: list[int]
    num_computed_tokens: int  # tokens found in the prefix cache: this step starts after them
    pooling_params: PoolingParams | None = None  # an embedding request: pooled, never sampled


@dataclass
class CachedRequestData:
    req_id: str
    new_block_ids: list[int]
    num_computed_tokens: int  # before this step


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData] = field(default_factory=list)
    scheduled_cached_reqs: list[CachedRequestData] = field(default_factory=list)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    total_num_scheduled_tokens: int = 0
    # Requests sent back to waiting this step; they come back as new requests.
    preempted_req_ids: list[str] = field(default_factory=list)
    # Requests finished or aborted since the previous step: the workers forget them.
    finished_req_ids: list[str] = field(default_factory=list)

    @cached_property
    def starts(self) -> dict[str, int]:
        """Each scheduled request's tokens computed before this step."""
        starts = {d.req_id: d.num_computed_tokens for d in self.scheduled_new_reqs}
        starts.update((d.req_id, d.num_computed_tokens) for d in self.scheduled_cached_reqs)
        return starts


@dataclass
class GrammarBitmask:
    """Packed token masks of the constrained requests that sample this step (1 = allowed); the
    engine core fills them while the workers run the forward."""

    req_ids: list[str]
    bitmask: torch.Tensor  # [len(req_ids), ceil(vocab / 32)] int32, on the CPU


@dataclass
class ModelRunnerOutput:
    # The requests that sampled this step, in the order of `sampled_token_ids`.
    req_ids: list[str] = field(default_factory=list)
    sampled_token_ids: list[int] = field(default_factory=list)
    logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)
    # Prompt logprobs of the positions computed this step, per request, from its first prompt
    # position in this step's chunk on (one entry per prompt token predicted).
    prompt_logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)
    # The embeddings of the pooling requests whose prompt this step completed.
    pooler_output: dict[str, list[float]] = field(default_factory=dict)
