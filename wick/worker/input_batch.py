"""The worker's own copy of the requests it runs, kept up to date from the step contract, and the
per-step tensors built from it."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from wick.core.sched_output import GrammarBitmask, SchedulerOutput
from wick.layers.sampler import SamplingMetadata
from wick.pooling_params import PoolingParams
from wick.sampling_params import SamplingParams


@dataclass(frozen=True)
class SamplingRow:
    """A request's sampling settings as one row of the sampler's tables (they never change)."""

    # temperature, top_p, min_p, presence penalty, frequency penalty, repetition penalty
    floats: tuple[float, float, float, float, float, float]
    top_k: int
    greedy: bool
    seed: int  # folded into int64
    logprobs: int | None
    adjusts_logits: bool  # logit_bias or min_tokens: the rows the sampler metadata looks at one by one

    @cached_property
    def plain(self) -> bool:
        """Drawn from its temperature, seed and step alone (no filter, penalty, logit adjustment or logprobs): what
        a decode graph's own draw covers."""
        temperature, top_p, min_p, presence, frequency, repetition = self.floats
        filtered = not self.greedy and (self.top_k > 0 or top_p < 1.0 or min_p > 0.0)
        penalized = presence != 0.0 or frequency != 0.0 or repetition != 1.0
        return not (filtered or penalized or self.adjusts_logits or self.logprobs is not None)


@dataclass
class CachedRequestState:
    req_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # the prompt, then every output token sampled so far
    sampling_params: SamplingParams
    seed: int
    num_computed_tokens: int
    # Tokens sampled by steps whose results have not reached the host yet (not in token_ids).
    num_pending: int = 0
    pooling_params: PoolingParams | None = None
    row: int = -1  # its row in the batch's block table

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

    @cached_property
    def sampling_row(self) -> SamplingRow:
        sp = self.sampling_params
        return SamplingRow((sp.temperature, sp.top_p, sp.min_p, sp.presence_penalty, sp.frequency_penalty,
                            sp.repetition_penalty), sp.top_k, sp.greedy, _fold_int64(self.seed), sp.logprobs,
                           bool(sp.logit_bias) or sp.min_tokens > 0)

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
    """The worker's requests, and their block ids as rows of one numpy table (a row per request, reused when
    a request leaves) from which a step's block table and slots are gathered at once; beside it, by the same
    rows, what a decode graph's draw needs: each request's temperature, seed and prompt length."""

    def __init__(self, num_rows: int = 16, num_blocks: int = 16) -> None:
        self.requests: dict[str, CachedRequestState] = {}
        self.block_table = np.zeros((num_rows, num_blocks), dtype=np.int32)
        self.num_blocks = np.zeros(num_rows, dtype=np.int32)
        self.temperature = np.zeros(num_rows, dtype=np.float32)
        self.seed = np.zeros(num_rows, dtype=np.int64)
        self.num_prompt_tokens = np.zeros(num_rows, dtype=np.int64)
        self._free_rows = list(range(num_rows - 1, -1, -1))

    def update(self, scheduler_output: SchedulerOutput) -> list[ScheduledState]:
        """Applies one step's contract; returns the step's requests in the scheduler's order."""
        for rid in scheduler_output.finished_req_ids:
            self._remove(rid)
        for rid in scheduler_output.preempted_req_ids:
            self._remove(rid)
        for new in scheduler_output.scheduled_new_reqs:
            state = self.requests[new.req_id] = CachedRequestState(
                new.req_id, list(new.prompt_token_ids), list(new.prompt_token_ids) + list(new.output_token_ids),
                new.sampling_params, new.seed, new.num_computed_tokens,
                pooling_params=new.pooling_params, row=self._take_row())
            self._append_blocks(state.row, new.block_ids)
            self.temperature[state.row] = state.sampling_row.floats[0]
            self.seed[state.row] = state.sampling_row.seed
            self.num_prompt_tokens[state.row] = state.num_prompt_tokens
        for cached in scheduler_output.scheduled_cached_reqs:
            state = self.requests[cached.req_id]
            if cached.new_block_ids:
                self._append_blocks(state.row, cached.new_block_ids)
            state.num_computed_tokens = cached.num_computed_tokens
        scheduled = []
        for rid, n in scheduler_output.num_scheduled_tokens.items():
            state = self.requests[rid]
            start = state.num_computed_tokens
            done, pooling = start + n == state.num_tokens, state.pooling_params is not None
            scheduled.append(ScheduledState(state, start, n, done and not pooling, done and pooling))
            state.num_computed_tokens = start + n
        return scheduled

    def block_ids(self, state: CachedRequestState) -> list[int]:
        return self.block_table[state.row, :self.num_blocks[state.row]].tolist()

    def _remove(self, rid: str) -> None:
        state = self.requests.pop(rid, None)
        if state is not None:
            self.num_blocks[state.row] = 0
            self._free_rows.append(state.row)

    def _take_row(self) -> int:
        if not self._free_rows:
            rows = len(self.num_blocks)
            self.block_table = np.concatenate([self.block_table, np.zeros_like(self.block_table)])
            for name in ("num_blocks", "temperature", "seed", "num_prompt_tokens"):
                column = getattr(self, name)
                setattr(self, name, np.concatenate([column, np.zeros_like(column)]))
            self._free_rows = list(range(2 * rows - 1, rows - 1, -1))
        return self._free_rows.pop()

    def _append_blocks(self, row: int, block_ids: list[int]) -> None:
        start = int(self.num_blocks[row])
        end = start + len(block_ids)
        width = self.block_table.shape[1]
        if end > width:
            grown = np.zeros((len(self.num_blocks), max(end, 2 * width)), dtype=np.int32)
            grown[:, :width] = self.block_table
            self.block_table = grown
        self.block_table[row, start:end] = block_ids
        self.num_blocks[row] = end


def build_sampling_metadata(states: list[CachedRequestState], vocab_size: int, device: torch.device,
                            grammar: GrammarBitmask | None = None) -> SamplingMetadata:
    """The sampler's tensors for these rows. `grammar`'s bitmask is on the CPU (pinned on a GPU machine)."""
    rows = [state.sampling_row for state in states]
    floats = np.array([row.floats for row in rows], dtype=np.float64).T
    temperature, top_p, min_p, presence, frequency, repetition = floats
    top_k = np.fromiter((row.top_k for row in rows), np.int64, len(rows))
    randoms = ~np.fromiter((row.greedy for row in rows), bool, len(rows))
    use_repetition = bool((repetition != 1.0).any())
    use_penalties = use_repetition or bool((presence != 0.0).any() or (frequency != 0.0).any())

    bias_rows: list[int] = []
    bias_ids: list[int] = []
    bias_values: list[float] = []
    suppress_rows: list[int] = []
    suppress_ids: list[int] = []
    for row, (state, settings) in enumerate(zip(states, rows, strict=True)):
        if not settings.adjusts_logits:
            continue
        sp = state.sampling_params
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
    asked = [row.logprobs for row in rows if row.logprobs is not None]
    grammar_rows = None
    if grammar is not None:
        row_of = {state.req_id: row for row, state in enumerate(states)}
        grammar_rows = [row_of[rid] for rid in grammar.req_ids]
    # Two host-to-device copies for the per-row settings instead of one blocking copy each.
    steps = np.fromiter((s.num_output_tokens for s in states), np.int64, len(states))
    ints = np.stack([top_k, np.fromiter((row.seed for row in rows), np.int64, len(rows)), steps])
    floats_t, ints_t = torch.from_numpy(np.ascontiguousarray(floats, np.float32)), torch.from_numpy(ints)
    if device.type == "cuda":
        floats_t = floats_t.pin_memory().to(device, non_blocking=True)
        ints_t = ints_t.pin_memory().to(device, non_blocking=True)
    random_top_k, random_top_p, random_min_p = top_k[randoms], top_p[randoms], min_p[randoms]
    return SamplingMetadata(
        temperature=floats_t[0],
        top_p=floats_t[1],
        top_k=ints_t[0],
        min_p=floats_t[2],
        presence_penalty=floats_t[3],
        frequency_penalty=floats_t[4],
        repetition_penalty=floats_t[5],
        seeds=ints_t[1],
        steps=ints_t[2],
        output_counts=output_counts,
        prompt_mask=prompt_mask,
        bias_rows=tensor(bias_rows, torch.int64) if bias_rows else None,
        bias_token_ids=tensor(bias_ids, torch.int64) if bias_rows else None,
        bias_values=tensor(bias_values, torch.float32) if bias_rows else None,
        suppress_rows=tensor(suppress_rows, torch.int64) if suppress_rows else None,
        suppress_token_ids=tensor(suppress_ids, torch.int64) if suppress_rows else None,
        max_num_logprobs=max(asked) if asked else None,
        all_greedy=not randoms.any(),
        no_top_k=bool((random_top_k == 0).all()),
        no_top_p=bool((random_top_p >= 1.0).all()),
        no_min_p=bool((random_min_p == 0.0).all()),
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
