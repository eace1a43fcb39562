"""The float GEMV against x @ W^T (+ b) in float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from wick.kernels.dense_gemv import DENSE_GEMV_CONFIGS, dense_gemv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
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


@pytest.mark.parametrize("least_k", [least_k for least_k, _ in DENSE_GEMV_CONFIGS])
def test_default_configs(least_k: int) -> None:
    """Each default shape past a whole step, and x with leading dimensions [1, 1]."""
    _check(48, least_k + 1100, torch.bfloat16, leading=(1, 1))


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
