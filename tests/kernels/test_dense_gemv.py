"""The float GEMV against x @ W^T (+ b) in float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from wick.kernels.dense_gemv import FEW_ROWS, WIDE_FROM_K, dense_gemv
from wick.kernels.rms_norm import RowNorm, fused_add_rms_norm_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# A pending norm's rows: the interpreter rounds float32 to bfloat16 by truncation, the GPU and torch to nearest.
NORM_DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float16
NORM_RTOL = 2**-6 if DEVICE == "cuda" else 2**-9
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}


def _check(n: int, k: int, dtype: torch.dtype, config: tuple[int, int, int] | None = None, bias: bool = False,
           leading: tuple[int, ...] = (1,)) -> None:
    g = torch.Generator().manual_seed(n * k)
    weight = torch.randn(n, k, generator=g).to(DEVICE, dtype)
    b = torch.randn(n, generator=g).to(DEVICE, dtype) if bias else None
    x = torch.randn(*leading, k, generator=g).to(DEVICE, dtype)
    expected = x.double() @ weight.double().t() + (0 if b is None else b.double())
    out = dense_gemv(x, weight, b, config)
    assert out.dtype == dtype and out.shape == (*leading, n)
    torch.testing.assert_close(out.double(), expected, atol=TOLERANCE[dtype] * expected.abs().max().item(), rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(40, 96), (37, 300), (8, 1024)], ids=str)
def test_matches_reference(shape: tuple[int, int], dtype: torch.dtype) -> None:
    """Whole tiles, and rows and columns past the last whole tile."""
    _check(*shape, dtype, config=(8, 64, 2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_bias(dtype: torch.dtype) -> None:
    _check(37, 300, dtype, config=(8, 64, 2), bias=True)


@pytest.mark.parametrize(("rows", "k"), [(48, 1100), (48, 2148), (FEW_ROWS + 2, 2148), (48, WIDE_FROM_K + 1100)])
def test_default_configs(rows: int, k: int) -> None:
    """Each default config past a whole step, and x with leading dimensions [1, 1]."""
    _check(rows, k, torch.bfloat16, leading=(1, 1))


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh", "gelu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("config", [(4, 64, 2), (1, 128, 1)], ids=str)
def test_gated(activation: str, dtype: torch.dtype, config: tuple[int, int, int]) -> None:
    """A merged gate/up layer's rows (37 of each, past the last whole tile) with bias -> act(gate) * up."""
    g = torch.Generator().manual_seed(7)
    weight = torch.randn(74, 300, generator=g).to(DEVICE, dtype)
    b = torch.randn(74, generator=g).to(DEVICE, dtype)
    x = torch.randn(1, 300, generator=g).to(DEVICE, dtype)
    gate, up = (x.double() @ weight.double().t() + b.double()).chunk(2, dim=-1)
    if activation == "silu":
        expected = F.silu(gate) * up
    else:
        expected = F.gelu(gate, approximate="tanh" if activation == "gelu_tanh" else "none") * up
    out = dense_gemv(x, weight, b, config, activation=activation)
    assert out.dtype == dtype and out.shape == (1, 37)
    torch.testing.assert_close(out.double(), expected, atol=2 * TOLERANCE[dtype] * expected.abs().max().item(), rtol=0)


def test_gated_odd_rows() -> None:
    with pytest.raises(ValueError, match="even number of rows"):
        dense_gemv(torch.ones(1, 8, device=DEVICE), torch.ones(7, 8, device=DEVICE), activation="silu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gemma3_lm_head() -> None:
    """Gemma 3's LM head, 262,208 rows: more programs than a grid's second dimension holds."""
    _check(262208, 256, torch.bfloat16)


@pytest.mark.parametrize("activation", [None, "silu"])
@pytest.mark.parametrize("config", [(4, 64, 2), (2, 512, 4)], ids=str)
def test_norm(config: tuple[int, int, int], activation: str | None) -> None:
    """With a RowNorm the GEMV reads rms_norm(x + residual) (over one step of K and over several): its program 0
    stores x + residual out of place and the normed row (the reference's, but for the order of the squares'
    sum), and the result is the GEMV of that row."""
    g = torch.Generator().manual_seed(9)
    x, residual = (torch.randn(1, 300, generator=g).to(DEVICE, NORM_DTYPE) for _ in range(2))
    norm_weight = torch.empty(300).normal_(1.0, 0.3, generator=g).to(DEVICE, NORM_DTYPE)
    weight = torch.randn(74, 300, generator=g).to(DEVICE, NORM_DTYPE)
    kept = residual.clone()
    norm = RowNorm(norm_weight, 1e-6, residual, torch.empty_like(residual), torch.empty_like(x))
    out = dense_gemv(x, weight, config=config, activation=activation, norm=norm)
    expected_row, expected_sum = fused_add_rms_norm_ref(x, residual, norm_weight, 1e-6)
    assert torch.equal(residual, kept) and torch.equal(norm.residual_out, expected_sum)
    torch.testing.assert_close(norm.normed_out, expected_row, rtol=NORM_RTOL, atol=1e-5)
    expected = dense_gemv(norm.normed_out, weight, config=config, activation=activation)
    torch.testing.assert_close(out, expected, atol=TOLERANCE[NORM_DTYPE] * expected.abs().max().item(), rtol=0)
