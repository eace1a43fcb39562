"""The worker's own copy of the requests it runs, kept up to date from the step contract, and the
per-step tensors built from it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from wick.core.sched_output import GrammarBitmask, SchedulerOutput
from wick.layers.sampler import SamplingMetadata
from wick.pooling_params import PoolingParams
from wick.sampling_params import SamplingParams


@dataclass
class CachedRequestState:
    req_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # the prompt, then every output token sampled so far
    sampling_params: SamplingParams
    seed: int
    block_ids: list[int]
    num_computed_tokens: int
    # Tokens sampled by steps whose results have not reached the host yet (not in token_ids).
    num_pending: int = 0
    pooling_params: PoolingParams | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Every token the request has, pending ones included."""
        return len(self.token_ids) + self.num_pending

    @property
    def num_output_tokens(self) -> int:
        """Every token sampled so far, pending ones included."""
        return self.num_tokens - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        """The sampled tokens on the host (without pending ones)."""
        return self.token_ids[len(self.prompt_token_ids):]


@dataclass
class ScheduledState:
    """This step computes positions start .. start + num_new_tokens - 1 of `state`."""

    state: CachedRequestState
    start: int
    num_new_tokens: int
    samples: bool  # the step reaches the request's last token, so a new one is sampled
    pools: bool = False  # an embedding request whose prompt this step completes: its hidden states are pooled


class InputBatch:
    def __init__(self) -> None:
        self.requests: dict[str, CachedRequestState] = {}

    def update(self, scheduler_output: SchedulerOutput) -> list[ScheduledState]:
        """Applies one step's contract; returns the step's requests in the scheduler's order."""
        for rid in scheduler_output.finished_req_ids:
            self.requests.pop(rid, None)
        for rid in scheduler_output.preempted_req_ids:
            self.requests.pop(rid, None)
        for new in scheduler_output.scheduled_new_reqs:
            self.requests[new.req_id] = CachedRequestState(
                new.req_id, list(new.prompt_token_ids), list(new.prompt_token_ids) + list(new.output_token_ids),
                new.sampling_params, new.seed, list(new.block_ids), new.num_computed_tokens,
                pooling_params=new.pooling_params)
        for cached in scheduler_output.scheduled_cached_reqs:
            state = self.requests[cached.req_id]
            state.block_ids.extend(cached.new_block_ids)
            state.num_computed_tokens = cached.num_computed_tokens
        scheduled = []
        for rid, n in scheduler_output.num_scheduled_tokens.items():
            state = self.requests[rid]
            start = state.num_computed_tokens
            done, pooling = start + n == state.num_tokens, state.pooling_params is not None
            scheduled.append(ScheduledState(state, start, n, done and not pooling, done and pooling))
            state.num_computed_tokens = start + n
        return scheduled


def build_sampling_metadata(states: list[CachedRequestState], vocab_size: int, device: torch.device,
                            grammar: GrammarBitmask | None = None) -> SamplingMetadata:
    """The sampler's tensors for these rows. `grammar`'s bitmask is on the CPU (pinned on a GPU machine)."""
    params = [state.sampling_params for state in states]
    random_params = [sp for sp in params if not sp.greedy]
    use_repetition = any(sp.repetition_penalty != 1.0 for sp in params)
    use_penalties = use_repetition or any(sp.presence_penalty != 0.0 or sp.frequency_penalty != 0.0 for sp in params)

    bias_rows: list[int] = []
    bias_ids: list[int] = []
    bias_values: list[float] = []
    suppress_rows: list[int] = []
    suppress_ids: list[int] = []
    for row, (state, sp) in enumerate(zip(states, params, strict=True)):
        for token_id, bias in (sp.logit_bias or {}).items():
            if not 0 <= int(token_id) < vocab_size:
                raise ValueError(f"logit_bias token {token_id} is outside the vocabulary "
                                 f"(size {vocab_size}) of request {state.req_id}")
            bias_rows.append(row)
            bias_ids.append(int(token_id))
            bias_values.append(float(bias))
        if state.num_output_tokens < sp.min_tokens:
            blocked = set(sp.stop_token_ids or [])
            if not sp.ignore_eos:
                blocked.update(sp.eos_token_ids)
            # A stop id outside the vocabulary can never be sampled, so it needs no blocking.
            blocked_ids = sorted(t for t in blocked if t < vocab_size)
            suppress_rows.extend([row] * len(blocked_ids))
            suppress_ids.extend(blocked_ids)

    def tensor(values: list, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=device)

    output_counts = prompt_mask = None
    if use_penalties:
        if any(s.num_pending for s in states):
            raise RuntimeError("penalties need every sampled token on the host: the engine must not overlap them")
        output_counts = _token_table([s.output_token_ids for s in states], vocab_size, torch.float32, device)
    if use_repetition:
        prompt_mask = _token_table([s.prompt_token_ids for s in states], vocab_size, torch.bool, device)
    asked = [sp.logprobs for sp in params if sp.logprobs is not None]
    grammar_rows = None
    if grammar is not None:
        row_of = {state.req_id: row for row, state in enumerate(states)}
        grammar_rows = [row_of[rid] for rid in grammar.req_ids]
    # Two host-to-device copies for the per-row settings instead of one blocking copy each.
    pinned = device.type == "cuda"
    floats = torch.tensor([[sp.temperature for sp in params], [sp.top_p for sp in params],
                           [sp.min_p for sp in params], [sp.presence_penalty for sp in params],
                           [sp.frequency_penalty for sp in params], [sp.repetition_penalty for sp in params]],
                          dtype=torch.float32, pin_memory=pinned).to(device, non_blocking=True)
    ints = torch.tensor([[sp.top_k for sp in params], [_fold_int64(s.seed) for s in states],
                         [s.num_output_tokens for s in states]],
                        dtype=torch.int64, pin_memory=pinned).to(device, non_blocking=True)
    return SamplingMetadata(
        temperature=floats[0],
        top_p=floats[1],
        top_k=ints[0],
        min_p=floats[2],
        presence_penalty=floats[3],
        frequency_penalty=floats[4],
        repetition_penalty=floats[5],
        seeds=ints[1],
        steps=ints[2],
        output_counts=output_counts,
        prompt_mask=prompt_mask,
        bias_rows=tensor(bias_rows, torch.int64) if bias_rows else None,
        bias_token_ids=tensor(bias_ids, torch.int64) if bias_rows else None,
        bias_values=tensor(bias_values, torch.float32) if bias_rows else None,
        suppress_rows=tensor(suppress_rows, torch.int64) if suppress_rows else None,
        suppress_token_ids=tensor(suppress_ids, torch.int64) if suppress_rows else None,
        max_num_logprobs=max(asked) if asked else None,
        all_greedy=not random_params,
        all_random=len(random_params) == len(params),
        no_top_k=all(sp.top_k == 0 for sp in random_params),
        no_top_p=all(sp.top_p >= 1.0 for sp in random_params),
        no_min_p=all(sp.min_p == 0.0 for sp in random_params),
        grammar_rows=tensor(grammar_rows, torch.int64) if grammar is not None else None,
        grammar_bitmask=grammar.bitmask.to(device, non_blocking=True) if grammar is not None else None,
    )


def _fold_int64(seed: int) -> int:
    """Any integer to the int64 with the same low 64 bits."""
    return (seed + 2**63) % 2**64 - 2**63


def _token_table(token_lists: list[list[int]], vocab_size: int, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
    """[B, V] table: counts of each token per row (float) or its presence (bool)."""
    rows = [row for row, tokens in enumerate(token_lists) for _ in tokens]
    cols = [token for tokens in token_lists for token in tokens]
    rows_t = torch.tensor(rows, dtype=torch.int64, device=device)
    cols_t = torch.tensor(cols, dtype=torch.int64, device=device)
    if dtype == torch.bool:
        table = torch.zeros(len(token_lists), vocab_size, dtype=torch.bool, device=device)
        return table.index_put_((rows_t, cols_t), torch.tensor(True, device=device))
    table = torch.zeros(len(token_lists), vocab_size, dtype=dtype, device=device)
    return table.index_put_((rows_t, cols_t), torch.ones(len(cols), dtype=dtype, device=device),
                            accumulate=True)
