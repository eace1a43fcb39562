"""The FP8 weight kernel against x @ W^T over the torch dequantization, block-scaled and per-row."""

from __future__ import annotations

import pytest
import torch

from wick.kernels.fp8_matmul import FP8_TILE_CONFIGS, GEMV_MAX_ROWS, fp8_dequantize, fp8_gemv, fp8_matmul

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 3e-2}


def _check(rows: int, n: int, k: int, block: tuple[int, int], dtype: torch.dtype,
           gemv_config: tuple[int, int, int] | None = None,
           tile_config: tuple[int, int, int, int, int] | None = None) -> None:
    g = torch.Generator().manual_seed(n + k)
    weight = torch.randn(n, k, generator=g).clamp(-400, 400).to(torch.float8_e4m3fn).to(DEVICE)
    scale = (torch.rand(-(-n // block[0]), -(-k // block[1]), generator=g) * 1e-3).to(DEVICE)
    x = torch.randn(rows, k, generator=g).to(DEVICE, dtype)
    expected = x.float() @ fp8_dequantize(weight, scale, block).t()
    out = fp8_matmul(x, weight, scale, block, gemv_config=gemv_config, tile_config=tile_config)
    assert out.dtype == dtype and out.shape == (rows, n)
    torch.testing.assert_close(out.float(), expected, atol=TOLERANCE[dtype] * expected.abs().max().item(), rtol=0)


@pytest.mark.parametrize("rows", [1, GEMV_MAX_ROWS + 9, 70])
@pytest.mark.parametrize("block", [(128, 128), (1, 200), (128, 96)], ids=["block128", "per_row", "block96"])
def test_matches_dequantized(rows: int, block: tuple[int, int]) -> None:
    """One row (GEMV), a few (the tile kernel) and more than a row tile; 96-wide scale tiles take the row
    kernel, which scales each weight."""
    _check(rows, 160, 200, block, torch.float32)


@pytest.mark.parametrize("config", [c for _, c in FP8_TILE_CONFIGS], ids=str)
@pytest.mark.parametrize("block", [(128, 128), (1, 200)], ids=["block128", "per_row"])
def test_tile_configs(block: tuple[int, int], config: tuple[int, int, int, int, int]) -> None:
    _check(20, 160, 200, block, torch.float32, tile_config=config)


@pytest.mark.parametrize(("block", "config"), [((128, 128), (16, 64, 2)), ((1, 200), (4, 256, 4)),
                                               ((128, 128), (8, 256, 4))], ids=["in_tile", "per_row", "tile_split"])
def test_gemv_configs(block: tuple[int, int], config: tuple[int, int, int]) -> None:
    _check(2, 40, 200, block, torch.float32, gemv_config=config)


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("block", [(128, 128), (1, 200)], ids=["block128", "per_row"])
def test_gemv_gated(rows: int, block: tuple[int, int]) -> None:
    """Gate rows then up rows (80 each: the up rows start inside a 128-row scale tile) -> silu(gate) * up."""
    g = torch.Generator().manual_seed(rows)
    weight = torch.randn(160, 200, generator=g).clamp(-400, 400).to(torch.float8_e4m3fn).to(DEVICE)
    scale = (torch.rand(-(-160 // block[0]), -(-200 // block[1]), generator=g) * 1e-3).to(DEVICE)
    x = torch.randn(rows, 200, generator=g).to(DEVICE)
    gate, up = (x @ fp8_dequantize(weight, scale, block).t()).chunk(2, dim=-1)
    expected = torch.nn.functional.silu(gate) * up
    out = fp8_gemv(x, weight, scale, block, "silu", gemv_config=(4, 64, 2))
    torch.testing.assert_close(out, expected, atol=1e-5 * expected.abs().max().item(), rtol=1e-4)


def test_half_precision() -> None:
    _check(20, 64, 128, (128, 128), torch.float16)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("rows", [1, 5, 16, 64, 200, 700])
@pytest.mark.parametrize("block", [(128, 128), (1, 4096)], ids=["block128", "per_row"])
def test_gpu_bf16(rows: int, block: tuple[int, int]) -> None:
    _check(rows, 1536, 4096, block, torch.bfloat16)
