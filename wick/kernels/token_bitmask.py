"""Grammar masks applied to the logits: -inf for every token whose bit is 0 in its row's packed mask.

A mask row packs the vocabulary 32 tokens to an int32 word (bit t % 32 of word t // 32 for token t, xgrammar's
layout). The kernel writes -inf in place, reading each word once per token it covers; the torch path
(wick.layers.sampler.apply_token_bitmask_torch) materializes the unpacked [rows, vocab] mask instead
(benchmarks/kernels/bench_token_bitmask.py compares the two).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 4096  # tokens one program covers


@triton.jit
def _apply_token_bitmask_kernel(logits_ptr, rows_ptr, bitmask_ptr, vocab_size, stride_logits, stride_bitmask,
                                BLOCK: tl.constexpr):
    mask_row = tl.program_id(0)
    tokens = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_vocab = tokens < vocab_size
    row = tl.load(rows_ptr + mask_row).to(tl.int64)
    words = tl.load(bitmask_ptr + mask_row * stride_bitmask + tokens // 32, mask=in_vocab, other=-1)
    allowed = (words >> (tokens % 32)) & 1
    tl.store(logits_ptr + row * stride_logits + tokens, float("-inf"), mask=in_vocab & (allowed == 0))


def apply_token_bitmask_(logits: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor) -> None:
    """In place: in logits[rows[i]], -inf for the tokens whose bit in bitmask[i] is 0."""
    vocab_size = logits.shape[-1]
    assert logits.stride(-1) == 1 and bitmask.stride(-1) == 1 and bitmask.dtype == torch.int32
    grid = (rows.numel(), triton.cdiv(vocab_size, _BLOCK))
    _apply_token_bitmask_kernel[grid](logits, rows, bitmask, vocab_size, logits.stride(0), bitmask.stride(0),
                                      BLOCK=_BLOCK)

