"""Activations rounded to int8 in runs of 32 against the torch reference."""

from __future__ import annotations

import pytest
import torch

from wick.kernels.int8_activations import quantize_q8, quantize_q8_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("interleave", [False, True], ids=["in_order", "interleaved"])
def test_codes_scales_and_sums(interleave: bool) -> None:
    x = torch.randn(3, 320, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    x[1, 32:64] = 0.0  # a run of zeros: scale 0, codes 0
    q, d, s = quantize_q8(x, interleave=interleave)
    if interleave:  # each eight codes stored as the even ones, then the odd ones
        q = q.view(3, 40, 2, 4).transpose(2, 3).reshape(3, 320)
    codes = q.float().view(3, 10, 32)
    values = (codes * d[..., None]).reshape(3, 320)
    torch.testing.assert_close(values, quantize_q8_ref(x), atol=1e-6, rtol=0)
    assert q.abs().max().item() <= 127 and d[1, 1].item() == 0.0
    torch.testing.assert_close(s, d * codes.sum(-1))
    torch.testing.assert_close(values, x, atol=d.max().item() / 2 + 1e-6, rtol=0)
