"""The batched sampler: penalties, logprobs, temperature, top-k / top-p / min-p and seeded sampling,
all on the device with no per-request Python loop.

Randomness is a pure function of (request seed, output position, token id): a counter-based hash
gives every token its own uniform u, and the sampled token is argmax(prob / E) with E = -log(u) (the
exponential race, equivalent to Gumbel-max), taken in log space as argmax(logit / temperature - log E)
so that no softmax runs. So a request draws the same token whatever else is in the batch, whichever
row it sits in, and after preemption, without one torch.Generator per request. Logits stay in the
model's dtype unless something (logprobs, penalties, masks, filters) needs them in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from wick.sampling_params import _GREEDY_EPS

_M32 = 0xFFFF_FFFF
_GOLDEN = 0x9E37_79B9


@dataclass
class LogprobsTensors:
    """Column 0 holds the sampled (or target) token, columns 1.. the top-k tokens by logprob."""

    token_ids: torch.Tensor  # [B, 1 + k] int64
    logprobs: torch.Tensor  # [B, 1 + k] float32
    ranks: torch.Tensor  # [B] int64: rank of the column-0 token, 1 = most likely


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # [B] int64
    logprobs: LogprobsTensors | None  # set when any request asked for logprobs


@dataclass
class SamplingMetadata:
    """One row per request that samples this step; every tensor lives on the sampling device."""

    temperature: torch.Tensor  # [B] float32; < 1e-5 means greedy
    top_p: torch.Tensor  # [B] float32
    top_k: torch.Tensor  # [B] int64, 0 = off
    min_p: torch.Tensor  # [B] float32
    presence_penalty: torch.Tensor  # [B] float32
    frequency_penalty: torch.Tensor  # [B] float32
    repetition_penalty: torch.Tensor  # [B] float32
    seeds: torch.Tensor  # [B] int64 (64-bit seeds folded into int64)
    steps: torch.Tensor  # [B] int64: output tokens so far, the RNG counter
    output_counts: torch.Tensor | None  # [B, V] float32 counts of generated tokens; None: no penalties
    prompt_mask: torch.Tensor | None  # [B, V] bool tokens in the prompt; None: no repetition penalty
    # logit_bias in sparse form: logits[bias_rows, bias_token_ids] += bias_values.
    bias_rows: torch.Tensor | None  # [N] int64
    bias_token_ids: torch.Tensor | None  # [N] int64
    bias_values: torch.Tensor | None  # [N] float32
    # min_tokens: logits[suppress_rows, suppress_token_ids] = -inf.
    suppress_rows: torch.Tensor | None  # [M] int64
    suppress_token_ids: torch.Tensor | None  # [M] int64
    max_num_logprobs: int | None  # largest `logprobs` asked for; None when no request asked
    all_greedy: bool
    # Skip flags, over the rows that sample at random.
    no_top_k: bool
    no_top_p: bool
    no_min_p: bool
    # Structured output: grammar_bitmask[i] packs the tokens allowed in row grammar_rows[i] (bit t of
    # the int32 word t // 32 for token t); rows not listed are unconstrained.
    grammar_rows: torch.Tensor | None = None  # [G] int64
    grammar_bitmask: torch.Tensor | None = None  # [G, ceil(V / 32)] int32


def apply_token_bitmask(logits: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """A copy of `logits` with -inf, in each of `rows`, for the tokens whose bit in that row's packed mask is 0."""
    if logits.is_cuda:
        # Imported on first use: Triton fixes at import whether it compiles or interprets its kernels.
        from wick.kernels.token_bitmask import apply_token_bitmask_

        masked = logits.clone()
        apply_token_bitmask_(masked, rows, bitmask)
        return masked
    return apply_token_bitmask_torch(logits, rows, bitmask)


def apply_token_bitmask_torch(logits: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """apply_token_bitmask in torch ops: every bit unpacked, then masked_fill."""
    shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
    allowed = ((bitmask[:, :, None] >> shifts) & 1).flatten(1)[:, :logits.shape[-1]].bool()
    return logits.index_put((rows,), logits[rows].masked_fill(~allowed, float("-inf")))


def process_logits(logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
    """Grammar masks, then logit_bias, then min_tokens blocking, then penalties; returns a new tensor.

    Penalties: repetition first (HF/vLLM: for tokens in the prompt or the output, a positive logit
    is divided by r, a negative one multiplied by r), then OpenAI's
    logit[t] -= frequency_penalty * count[t] + presence_penalty * (count[t] > 0), where count
    covers generated tokens only.
    """
    if (metadata.grammar_rows is None and metadata.bias_rows is None and metadata.suppress_rows is None
            and metadata.output_counts is None):
        return logits
    logits = logits.float()
    if metadata.grammar_rows is not None:
        logits = apply_token_bitmask(logits, metadata.grammar_rows, metadata.grammar_bitmask)
    if metadata.bias_rows is not None:
        logits = logits.index_put((metadata.bias_rows, metadata.bias_token_ids), metadata.bias_values,
                                  accumulate=True)
    if metadata.suppress_rows is not None:
        logits = logits.index_put((metadata.suppress_rows, metadata.suppress_token_ids),
                                  torch.tensor(float("-inf"), device=logits.device))
    counts = metadata.output_counts
    if counts is None:
        return logits
    generated = counts > 0
    if metadata.prompt_mask is not None:
        seen = generated | metadata.prompt_mask
        r = metadata.repetition_penalty[:, None]
        logits = torch.where(seen, torch.where(logits > 0, logits / r, logits * r), logits)
    return (logits - metadata.frequency_penalty[:, None] * counts
            - metadata.presence_penalty[:, None] * generated)


class Sampler(nn.Module):
    """Turns one row of float32 logits per request into a token, and logprobs when asked.

    Logprobs are "raw": log_softmax of the logits as the model produced them, before logit_bias,
    min_tokens blocking, penalties, temperature and top-k/top-p/min-p (vLLM's default). The token is
    drawn from the processed distribution, so its raw logprob may be below that of unsampled ones.
    """

    def forward(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        raw_logprobs = logits.float().log_softmax(-1) if metadata.max_num_logprobs is not None else None
        logits = process_logits(logits, metadata)
        if not (metadata.all_greedy or (metadata.no_top_k and metadata.no_top_p and metadata.no_min_p)):
            logits = _filter(logits, metadata)
        if logits.is_cuda:
            # Imported on first use: Triton fixes at import whether it compiles or interprets its kernels.
            from wick.kernels.sampling import exponential_race

            sampled = exponential_race(logits, metadata.temperature, metadata.seeds, metadata.steps)
        else:
            sampled = exponential_race_torch(logits, metadata.temperature, metadata.seeds, metadata.steps)
        logprobs = None
        if raw_logprobs is not None:
            logprobs = _gather_logprobs(raw_logprobs, sampled, metadata.max_num_logprobs)
        return SamplerOutput(sampled_token_ids=sampled, logprobs=logprobs)


def compute_prompt_logprobs(logits: torch.Tensor, target_ids: torch.Tensor,
                            num_logprobs: int) -> LogprobsTensors:
    """Logprobs of each target token (raw log_softmax of `logits` [P, V]) and the top `num_logprobs`."""
    return _gather_logprobs(logits.float().log_softmax(-1), target_ids, num_logprobs)


def _gather_logprobs(logprobs: torch.Tensor, token_ids: torch.Tensor, k: int) -> LogprobsTensors:
    token_logprobs = logprobs.gather(-1, token_ids[:, None])
    ranks = (logprobs > token_logprobs).sum(-1) + 1
    ids, values = token_ids[:, None], token_logprobs
    if k > 0:
        top_values, top_ids = logprobs.topk(k, dim=-1)
        ids = torch.cat([ids, top_ids], dim=1)
        values = torch.cat([values, top_values], dim=1)
    return LogprobsTensors(token_ids=ids, logprobs=values, ranks=ranks)


def _filter(logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
    """logits in float32, -inf in the rows that sample at random outside top-k, top-p and min-p, which are taken
    over logits / temperature (min-p's p < min_p * max p as logit / t < max(logit / t) + log(min_p))."""
    logits = logits.float()
    random_rows = metadata.temperature >= _GREEDY_EPS
    scaled = logits / metadata.temperature.clamp(min=_GREEDY_EPS)[:, None]
    if not (metadata.no_top_k and metadata.no_top_p):
        scaled = _top_k_top_p(scaled, metadata.top_k, metadata.top_p)
    if not metadata.no_min_p:
        floor = scaled.amax(-1, keepdim=True) + metadata.min_p[:, None].log()
        scaled = scaled.masked_fill(scaled < floor, float("-inf"))
    return logits.masked_fill((scaled == float("-inf")) & random_rows[:, None], float("-inf"))


def exponential_race_torch(logits: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor,
                           steps: torch.Tensor) -> torch.Tensor:
    """[B] int64: a greedy row's argmax of logits; a random row's argmax of logits / temperature - log E, E the
    row's random_exponentials (a filtered token's -inf logit cannot win: the top token always stays, finite).
    A reciprocal and a product rather than a quotient, as the kernel computes it (one division a row)."""
    greedy = temperature < _GREEDY_EPS
    if bool(greedy.all()):
        return logits.argmax(-1)
    exponentials = random_exponentials(seeds, steps, logits.shape[-1])
    scores = logits.float() * (1.0 / temperature.clamp(min=_GREEDY_EPS))[:, None] - exponentials.log()
    return torch.where(greedy, logits.argmax(-1), scores.argmax(-1))


def _top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Sets to -inf every token outside the k highest, then outside the smallest set whose
    probability (renormalized after top-k) reaches top_p; the top token always stays."""
    vocab_size = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    position = torch.arange(vocab_size, device=logits.device)
    k = torch.where(top_k > 0, top_k, vocab_size)
    sorted_logits = sorted_logits.masked_fill(position >= k[:, None], float("-inf"))
    probs = sorted_logits.softmax(-1)
    mass_before = probs.cumsum(-1) - probs
    # Rows with top_p == 1 skip the test: rounding in the cumsum could otherwise drop the tail.
    drop = (mass_before >= top_p[:, None]) & (top_p < 1.0)[:, None]
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for 0 <= x < 2**32, in 16-bit halves of c so no int64 product overflows."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _M32


def _mix32(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finalizer: a bijection on [0, 2**32) with full avalanche."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EB_CA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2_AE35)
    return h ^ (h >> 16)


def random_exponentials(seeds: torch.Tensor, steps: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[B, V] float32 Exp(1) draws, a pure function of (seed, step, token id) for each row.

    Each row's key hashes both 32-bit halves of its seed and its step; each token's value is
    mix32(row key XOR mix32(token id + golden)); the top 23 bits give u = (2j + 1) / 2**24, which
    float32 holds exactly and which lies strictly inside (0, 1), so -log(u) is finite and positive.
    """
    low, high = seeds & _M32, (seeds >> 32) & _M32
    key = _mix32((low + _mix32((high + _GOLDEN) & _M32)) & _M32)
    key = _mix32(key ^ _mix32((steps + 2 * _GOLDEN) & _M32))
    tokens = _mix32((torch.arange(vocab_size, device=seeds.device) + 3 * _GOLDEN) & _M32)
    bits = _mix32(key[:, None] ^ tokens[None, :])
    uniform = ((bits >> 8) | 1).to(torch.float32) * 2.0**-24
    return -torch.log(uniform)
