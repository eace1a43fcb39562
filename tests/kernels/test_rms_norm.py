"""The fused RMSNorm kernels against their pure-torch reference and the RMSNorm layer's torch path."""

from __future__ import annotations

import pytest
import torch

from wick.kernels.int8_activations import quantize_q8
from wick.kernels.rms_norm import (
    RowNorm,
    fused_add_rms_norm,
    fused_add_rms_norm_ref,
    rms_norm,
    rms_norm_ref,
    row_norm,
    row_norm_q8,
)
from wick.layers.norm import RMSNorm

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# The variance is summed in another order than torch's; one fp32 ulp of it can move the row rounded to
# the input dtype by one ulp, which the weight's multiply can turn into two of the output's.
TOLERANCE = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-6},
    torch.float16: {"rtol": 2**-9, "atol": 1e-5},
    torch.bfloat16: {"rtol": 2**-6, "atol": 1e-5},
}
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def random_weight(dim: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(dim, dtype=dtype, device=DEVICE).normal_(1.0, 0.3)


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, **TOLERANCE[expected.dtype])


def check_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> None:
    out = rms_norm(x, weight, eps)
    assert out.shape == x.shape and out.is_contiguous()
    assert_close(out, rms_norm_ref(x, weight, eps))


def check_fused_add(num_tokens: int, dim: int, dtype: torch.dtype, eps: float = 1e-6, x_norm: bool = False) -> None:
    """x_norm: x is RMS-normalized (another weight and eps) before the add, in the same kernel; that must give
    exactly what rms_norm then fused_add_rms_norm give, and match the reference as they do."""
    torch.manual_seed(0)
    x = torch.randn(num_tokens, dim, dtype=dtype, device=DEVICE)
    residual = torch.randn(num_tokens, dim, dtype=dtype, device=DEVICE) * 4
    weight = random_weight(dim, dtype)
    first = (random_weight(dim, dtype), 1e-5) if x_norm else None
    expected, expected_residual = fused_add_rms_norm_ref(rms_norm_ref(x, *first) if first else x, residual, weight,
                                                         eps)
    if first:
        two_kernels, two_kernels_residual = fused_add_rms_norm(rms_norm(x, *first), residual.clone(), weight, eps)
    out, new_residual = fused_add_rms_norm(x, residual, weight, eps, first)
    assert new_residual is residual
    if first:
        torch.testing.assert_close(residual, two_kernels_residual, atol=0, rtol=0)
        torch.testing.assert_close(out, two_kernels, atol=0, rtol=0)
        if dtype == torch.bfloat16:  # an ulp of the first norm tips the sum's rounding where it cancels
            return
        torch.testing.assert_close(residual, expected_residual, rtol=TOLERANCE[dtype]["rtol"],
                                   atol=4 * torch.finfo(dtype).eps)
    else:
        torch.testing.assert_close(residual, expected_residual, atol=0, rtol=0)
    assert_close(out, expected)


def per_head_views(num_tokens: int, num_heads: int, num_kv_heads: int, head_dim: int,
                   dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, Hq, D] and k [T, Hk, D] as the models hand them to q_norm / k_norm: views into one qkv row."""
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, dtype=dtype, device=DEVICE)
    q, k, _ = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1)
    return q.reshape(-1, num_heads, head_dim), k.reshape(-1, num_kv_heads, head_dim)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("dim", [32, 48])
def test_rms_norm_matches_reference(dtype: torch.dtype, dim: int) -> None:
    torch.manual_seed(0)
    check_rms_norm(torch.randn(5, dim, dtype=dtype, device=DEVICE) * 3, random_weight(dim, dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_per_head_norm_of_strided_views(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    q, k = per_head_views(num_tokens=3, num_heads=3, num_kv_heads=2, head_dim=16, dtype=dtype)
    assert not q.is_contiguous()
    check_rms_norm(q, random_weight(16, dtype))
    check_rms_norm(k, random_weight(16, dtype))


@pytest.mark.parametrize("x_norm", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fused_add_matches_reference(dtype: torch.dtype, x_norm: bool) -> None:
    check_fused_add(num_tokens=7, dim=40, dtype=dtype, x_norm=x_norm)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_matches_layer_torch_path(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    layer = RMSNorm(24, eps=1e-5).to(dtype)
    layer.weight.data.normal_(1.0, 0.3)
    x, residual = torch.randn(4, 24, dtype=dtype), torch.randn(4, 24, dtype=dtype)
    expected, expected_residual = layer(x, residual)
    weight = layer.weight.to(DEVICE)
    assert_close(rms_norm(x.to(DEVICE), weight, layer.eps).cpu(), layer(x))
    out, new_residual = fused_add_rms_norm(x.to(DEVICE), residual.to(DEVICE), weight, layer.eps)
    torch.testing.assert_close(new_residual.cpu(), expected_residual, atol=0, rtol=0)
    assert_close(out.cpu(), expected)


def test_layer_with_x_norm_matches_x_norm_then_layer() -> None:
    """RMSNorm given the norm of x (fused on CUDA) against that norm's output added the usual way."""
    torch.manual_seed(0)
    layer, first = RMSNorm(24, eps=1e-5).to(DEVICE), RMSNorm(24, eps=1e-6).to(DEVICE)
    layer.weight.data.normal_(1.0, 0.3)
    first.weight.data.normal_(1.0, 0.3)
    x, residual = torch.randn(4, 24, device=DEVICE), torch.randn(4, 24, device=DEVICE)
    out, new_residual = layer(x, residual.clone(), first)
    expected, expected_residual = layer(first(x), residual.clone())
    assert_close(new_residual, expected_residual)
    assert_close(out, expected)


def test_fp32_weight_promotes_output() -> None:
    x = torch.randn(2, 16, dtype=torch.float16, device=DEVICE)
    weight = random_weight(16, torch.float32)
    out = rms_norm(x, weight, 1e-6)
    assert out.dtype == torch.float32
    assert_close(out, rms_norm_ref(x, weight, 1e-6))


def test_no_rows() -> None:
    x = torch.empty(0, 16, device=DEVICE)
    assert rms_norm(x, random_weight(16, torch.float32), 1e-6).shape == (0, 16)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("num_tokens", [1, 256, 8192])
@pytest.mark.parametrize("dim", [1024, 4096])
def test_bf16_cuda(num_tokens: int, dim: int) -> None:
    torch.manual_seed(0)
    x = torch.randn(num_tokens, dim, dtype=torch.bfloat16, device=DEVICE)
    weight = random_weight(dim, torch.bfloat16)
    out = rms_norm(x, weight, 1e-6)
    expected = rms_norm_ref(x, weight, 1e-6)
    assert_close(out, expected)
    assert (out == expected).float().mean() > 0.999
    check_fused_add(num_tokens, dim, torch.bfloat16)
    check_fused_add(num_tokens, dim, torch.bfloat16, x_norm=True)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("num_tokens", [1, 256, 8192])
def test_per_head_bf16_cuda(num_tokens: int) -> None:
    torch.manual_seed(0)
    q, k = per_head_views(num_tokens, num_heads=16, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16)
    check_rms_norm(q, random_weight(128, torch.bfloat16))
    check_rms_norm(k, random_weight(128, torch.bfloat16))


@pytest.mark.gpu
@needs_cuda
def test_layer_dispatches_and_captures_in_cuda_graph() -> None:
    torch.manual_seed(0)
    layer = RMSNorm(1024).to(DEVICE, torch.bfloat16)
    layer.weight.data.normal_(1.0, 0.3)
    x = torch.randn(8, 1024, dtype=torch.bfloat16, device=DEVICE)
    residual = torch.randn_like(x)
    expected, expected_residual = fused_add_rms_norm_ref(x, residual, layer.weight, layer.eps)
    layer(x, residual.clone())  # compiles the kernel outside the capture
    graph = torch.cuda.CUDAGraph()
    graph_residual = residual.clone()
    with torch.cuda.graph(graph):
        out, _ = layer(x, graph_residual)
    graph_residual.copy_(residual)
    graph.replay()
    torch.testing.assert_close(graph_residual, expected_residual, atol=0, rtol=0)
    assert_close(out, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_row_norm_out_of_place(dtype: torch.dtype) -> None:
    """A pending norm's kernel: x + residual into residual_out, the residual left as it was, the normed row into
    normed_out."""
    g = torch.Generator().manual_seed(11)
    x, residual = (torch.randn(1, 96, generator=g).to(DEVICE, dtype) for _ in range(2))
    weight = random_weight(96, dtype)
    kept = residual.clone()
    norm = RowNorm(weight, 1e-6, residual, torch.empty_like(residual), torch.empty_like(x))
    out = row_norm(x, norm)
    expected, expected_sum = fused_add_rms_norm_ref(x, residual, weight, 1e-6)
    assert out is norm.normed_out and torch.equal(residual, kept)
    torch.testing.assert_close(norm.residual_out, expected_sum, rtol=0, atol=0)
    assert_close(out, expected)


@pytest.mark.parametrize("interleave", [False, True], ids=["in_order", "interleaved"])
@pytest.mark.parametrize("dim", [256, 384])
def test_row_norm_rounds_its_row_to_int8(dim: int, interleave: bool) -> None:
    """The norm kernel rounding its row for an int8 GEMV: the row and residual row_norm writes, and exactly the
    codes, scales and sums quantize_q8 makes of that row (384: a row narrower than its power-of-two tile)."""
    g = torch.Generator().manual_seed(12)
    x, residual = (torch.randn(1, dim, generator=g).to(DEVICE, torch.float16) for _ in range(2))
    weight = random_weight(dim, torch.float16)
    fused, plain = (RowNorm(weight, 1e-6, residual, torch.empty_like(residual), torch.empty_like(x))
                    for _ in range(2))
    rows = row_norm_q8(x, fused, interleave)
    row_norm(x, plain)
    assert torch.equal(fused.normed_out, plain.normed_out) and torch.equal(fused.residual_out, plain.residual_out)
    for got, expected in zip(rows, quantize_q8(plain.normed_out, interleave), strict=True):
        assert torch.equal(got, expected)
    assert rows.q.abs().max().item() == 127
