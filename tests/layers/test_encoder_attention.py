"""Encoder attention over a packed batch against each sequence attending alone with SDPA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from wick.layers.attention.encoder import PaddedLayout, VarlenLayout, encoder_layout, varlen_attention

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def packed(lengths: list[int], heads: int, head_dim: int, dtype: torch.dtype, device: str
           ) -> tuple[list[int], torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    query_start = [0]
    for n in lengths:
        query_start.append(query_start[-1] + n)
    q, k, v = torch.randn(3, query_start[-1], heads, head_dim, dtype=dtype, device=device).unbind(0)
    return query_start, q, k, v


def one_by_one(query_start: list[int], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scale: float) -> torch.Tensor:
    outs = []
    for start, end in zip(query_start[:-1], query_start[1:], strict=True):
        qs, ks, vs = (t[start:end].transpose(0, 1).float() for t in (q, k, v))
        outs.append(F.scaled_dot_product_attention(qs, ks, vs, scale=scale).transpose(0, 1))
    return torch.cat(outs)


@pytest.mark.parametrize("lengths", [[5, 1, 17, 9], [8, 8]], ids=["ragged", "equal"])
def test_padded_layout_matches_each_sequence_alone(lengths: list[int]) -> None:
    query_start, q, k, v = packed(lengths, heads=3, head_dim=16, dtype=torch.float32, device="cpu")
    layout = encoder_layout(query_start, torch.device("cpu"), torch.float32)
    assert isinstance(layout, PaddedLayout)
    torch.testing.assert_close(layout.attend(q, k, v, 0.25), one_by_one(query_start, q, k, v, 0.25))


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_varlen_matches_each_sequence_alone_cuda(dtype: torch.dtype) -> None:
    query_start, q, k, v = packed([37, 1, 256, 129, 64], heads=12, head_dim=32, dtype=dtype, device="cuda")
    layout = encoder_layout(query_start, torch.device("cuda"), dtype)
    assert isinstance(layout, VarlenLayout) and layout.max_len == 256
    tol = 2e-3 if dtype == torch.float16 else 1e-2  # a few units of the last place of each
    expected = one_by_one(query_start, q, k, v, 32**-0.5)
    torch.testing.assert_close(layout.attend(q, k, v, 32**-0.5).float(), expected, atol=tol, rtol=tol)
    padded = PaddedLayout.build(query_start, q.device).attend(q, k, v, 32**-0.5)
    cu = torch.tensor(query_start, dtype=torch.int32, device="cuda")
    torch.testing.assert_close(varlen_attention(q, k, v, cu, 256, 32**-0.5), padded, atol=tol, rtol=tol)
