"""The sampler's draw in one pass over the logits, in their dtype: a greedy row's argmax, a random row's seeded
exponential race in log space, token argmax(logit / t - log E) (= argmax(p / E) with p = softmax(logit / t)), where
E = -log(u) and u comes from the counter-based hash of (seed, step, token id) that
wick.layers.sampler.random_exponentials builds from int64 torch ops. Here the hash runs in native
uint32 arithmetic (wrapping multiplication is what the torch code's _mul32 emulates) and neither
the [B, V] exponentials, the probabilities nor any intermediate leaves the registers.

The grid is rows x vocabulary chunks, so that one long row still spreads over the GPU; each program
writes its chunk's best score and token, and a second kernel reduces each row's chunks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wick.sampling_params import _GREEDY_EPS

_BLOCK = 1024
# Enough programs to fill an H100/H200 several times over; chunks grow with the batch instead.
_TARGET_PROGRAMS = 2048
_NUM_WARPS = 4


@triton.jit
def _mix32(h):
    h ^= h >> 16
    h *= 0x85EBCA6B
    h ^= h >> 13
    h *= 0xC2B2AE35
    return h ^ (h >> 16)


@triton.jit
def _row_key(seeds_ptr, steps_ptr, row):
    seed = tl.load(seeds_ptr + row)
    step = tl.load(steps_ptr + row).to(tl.uint32)
    low = seed.to(tl.uint32)
    high = (seed >> 32).to(tl.uint32)
    # The additive constants are 1, 2 and 3 times 0x9E3779B9 (the golden ratio), mod 2**32.
    key = _mix32(low + _mix32(high + 0x9E3779B9))
    return _mix32(key ^ _mix32(step + 0x3C6EF372))


@triton.jit
def _token_bits(key, offs):
    return _mix32(key ^ _mix32(offs.to(tl.uint32) + 0xDAA66D2B))


@triton.jit
def _exponential(bits):
    uniform = ((bits >> 8) | 1).to(tl.float32) * 5.9604644775390625e-08
    return -tl.log(uniform)


@triton.jit
def _race_chunk_kernel(
    logits_ptr, temperature_ptr, seeds_ptr, steps_ptr, part_score_ptr, part_token_ptr,
    vocab_size, stride_row, chunk_size, num_chunks, greedy_below,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    key = _row_key(seeds_ptr, steps_ptr, row)
    temperature = tl.load(temperature_ptr + row)
    greedy = temperature < greedy_below
    inverse_temperature = tl.div_rn(1.0, tl.maximum(temperature, greedy_below))  # as the torch path clamps
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    lanes = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_token = tl.zeros([BLOCK], tl.int32)
    chunk_start = chunk * chunk_size
    chunk_end = tl.minimum(chunk_start + chunk_size, vocab_size)
    for start in range(chunk_start, chunk_end, BLOCK):
        offs = start + lanes
        mask = offs < chunk_end
        score = tl.load(row_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if not greedy:
            score = score * inverse_temperature - tl.log(_exponential(_token_bits(key, offs)))
        # torch.argmax takes the first NaN as the maximum: NaN scores become +inf, ties go to the lowest token.
        score = tl.where(score != score, float("inf"), score)
        score = tl.where(mask, score, float("-inf"))
        better = score > best
        best = tl.where(better, score, best)
        best_token = tl.where(better, offs, best_token)
    top = tl.max(best, axis=0)
    token = tl.min(tl.where(best == top, best_token, vocab_size), axis=0)
    tl.store(part_score_ptr + row * num_chunks + chunk, top)
    tl.store(part_token_ptr + row * num_chunks + chunk, token)


@triton.jit
def _race_reduce_kernel(
    part_score_ptr, part_token_ptr, out_ptr, num_chunks, vocab_size,
    CHUNKS_PAD: tl.constexpr,
):
    row = tl.program_id(0)
    chunks = tl.arange(0, CHUNKS_PAD)
    mask = chunks < num_chunks
    score = tl.load(part_score_ptr + row * num_chunks + chunks, mask=mask, other=float("-inf"))
    token = tl.load(part_token_ptr + row * num_chunks + chunks, mask=mask, other=vocab_size)
    top = tl.max(score, axis=0)
    tl.store(out_ptr + row, tl.min(tl.where(score == top, token, vocab_size), axis=0).to(tl.int64))


@triton.jit
def _random_draws_kernel(
    seeds_ptr, steps_ptr, bits_ptr, exponentials_ptr, vocab_size,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < vocab_size
    bits = _token_bits(_row_key(seeds_ptr, steps_ptr, row), offs)
    out = row.to(tl.int64) * vocab_size + offs
    tl.store(bits_ptr + out, bits.to(tl.int64), mask=mask)
    tl.store(exponentials_ptr + out, _exponential(bits), mask=mask)


def exponential_race(logits: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor, steps: torch.Tensor,
                     config: tuple[int, int, int] | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """[B] int64: per row, argmax over the vocabulary (ties: the lowest token id) of the logits where the row's
    temperature is below the greedy threshold, else of logits * (1 / temperature) - log E, with E the Exp(1) draws
    of wick.layers.sampler.random_exponentials(seeds, steps, V): wick.layers.sampler.exponential_race_torch.

    logits [B, V] in any float dtype; temperature [B] float32; seeds, steps [B] int64. No host sync. config:
    (tokens a step, programs aimed at, warps), for benchmarks; None takes the module's. out: [B] int64 to write
    the tokens into.
    """
    block, target_programs, num_warps = config or (_BLOCK, _TARGET_PROGRAMS, _NUM_WARPS)
    num_rows, vocab_size = logits.shape
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    temperature, seeds, steps = temperature.contiguous(), seeds.contiguous(), steps.contiguous()
    num_blocks = triton.cdiv(vocab_size, block)
    tiles_per_chunk = min(num_blocks, max(1, num_rows * num_blocks // target_programs))
    chunk_size = tiles_per_chunk * block
    num_chunks = triton.cdiv(num_blocks, tiles_per_chunk)
    part_score = torch.empty(num_rows, num_chunks, dtype=torch.float32, device=logits.device)
    part_token = torch.empty(num_rows, num_chunks, dtype=torch.int32, device=logits.device)
    if out is None:
        out = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
    if num_rows == 0:
        return out
    _race_chunk_kernel[(num_rows, num_chunks)](
        logits, temperature, seeds, steps, part_score, part_token,
        vocab_size, logits.stride(0), chunk_size, num_chunks, _GREEDY_EPS,
        BLOCK=block, num_warps=num_warps,
    )
    _race_reduce_kernel[(num_rows,)](
        part_score, part_token, out, num_chunks, vocab_size,
        CHUNKS_PAD=triton.next_power_of_2(num_chunks),
    )
    return out


def random_draws(seeds: torch.Tensor, steps: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The race's randomness made visible, for tests: ([B, V] int64 hash bits in [0, 2**32),
    [B, V] float32 exponentials), as the kernel computes them."""
    shape = (seeds.shape[0], vocab_size)
    bits = torch.empty(shape, dtype=torch.int64, device=seeds.device)
    exponentials = torch.empty(shape, dtype=torch.float32, device=seeds.device)
    if bits.numel():
        _random_draws_kernel[(shape[0], triton.cdiv(vocab_size, _BLOCK))](
            seeds, steps, bits, exponentials, vocab_size, BLOCK=_BLOCK)
    return bits, exponentials

