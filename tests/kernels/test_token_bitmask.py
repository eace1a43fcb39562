"""The grammar-mask kernel against its torch reference: random masks, edge bits, a vocabulary that is not a
multiple of 32 or of the block, rows in any order."""

from __future__ import annotations

import pytest
import torch

import wick.kernels.token_bitmask as token_bitmask
from wick.kernels.token_bitmask import apply_token_bitmask_
from wick.layers.sampler import apply_token_bitmask_torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("vocab_size", [70, 1000, 4096 + 33])
def test_kernel_matches_the_torch_reference(monkeypatch: pytest.MonkeyPatch, vocab_size: int) -> None:
    monkeypatch.setattr(token_bitmask, "_BLOCK", 256)
    generator = torch.Generator().manual_seed(vocab_size)
    logits = torch.randn(6, vocab_size, generator=generator).to(DEVICE)
    words = -(-vocab_size // 32)
    bitmask = torch.randint(-(2**31), 2**31, (3, words), dtype=torch.int64, generator=generator).to(torch.int32)
    bitmask[0] = -1  # every token allowed
    bitmask[1] = 0
    bitmask[1, 0] = -(2**31)  # token 31 alone: the sign bit
    bitmask = bitmask.to(DEVICE)
    rows = torch.tensor([4, 0, 2], device=DEVICE)
    expected = apply_token_bitmask_torch(logits, rows, bitmask)
    got = logits.clone()
    apply_token_bitmask_(got, rows, bitmask)
    assert torch.equal(got, expected)
    assert torch.isfinite(got[1]).all() and torch.isfinite(got[3]).all() and torch.isfinite(got[4]).all()
    assert torch.isfinite(got[0]).nonzero().flatten().tolist() == [31]
