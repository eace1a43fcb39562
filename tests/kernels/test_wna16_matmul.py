"""The W4A16 / W8A16 kernel against x @ W over the torch dequantization of the same packed weights."""

from __future__ import annotations

import pytest
import torch

from wick.kernels.gemv_split import _arrival_counts as arrival_counts
from wick.kernels.int8_activations import quantize_q8, quantize_q8_ref
from wick.kernels.wna16_matmul import (
    GEMV_MAX_ROWS,
    pack_rows,
    unpack_rows,
    wna16_dequantize,
    wna16_dequantize_triton,
    wna16_expert_gemv,
    wna16_int8_rows_matmul,
    wna16_matmul,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 3e-2}


def _weights(bits: int, k: int, n: int, group: int, shuffled: bool, dtype: torch.dtype,
             seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(bits + k + 1000 * seed)
    q = torch.randint(0, 1 << bits, (k, n), generator=g)
    groups = -(-k // group)
    g_idx = torch.arange(k) // group
    if shuffled:
        g_idx = g_idx[torch.randperm(k, generator=g)]
    scales = (torch.rand(groups, n, generator=g) * 0.02).to(dtype)
    zeros = torch.randint(0, 1 << bits, (groups, n), generator=g).to(dtype)
    return (pack_rows(q, bits).to(DEVICE), scales.to(DEVICE), zeros.to(DEVICE), g_idx.to(torch.int32).to(DEVICE))


def test_pack_round_trip() -> None:
    values = torch.randint(0, 16, (64, 5))
    assert torch.equal(unpack_rows(pack_rows(values, 4), 4), values)
    values = torch.randint(0, 256, (64, 5))
    assert torch.equal(unpack_rows(pack_rows(values, 8), 8), values)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("rows", [1, GEMV_MAX_ROWS + 9])
@pytest.mark.parametrize("shuffled", [False, True], ids=["sequential", "act_order"])
def test_matches_dequantized_matmul(bits: int, rows: int, shuffled: bool) -> None:
    _check(bits, rows, 192, 80, 32, shuffled, torch.float32)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("shuffled", [False, True], ids=["sequential", "act_order"])
def test_dequantize_kernel(bits: int, shuffled: bool) -> None:
    """The one-kernel dequantization against the reference, K and N not multiples of its tile."""
    weights = _weights(bits, 200, 136, 40, shuffled, torch.float32)
    torch.testing.assert_close(wna16_dequantize_triton(*weights, bits), wna16_dequantize(*weights, bits))


def test_half_precision() -> None:
    _check(4, 20, 128, 64, 64, False, torch.float16)


@pytest.mark.parametrize("bits", [4, 8])
def test_tiles_over_whole_groups_a_step(bits: int) -> None:
    """Groups of 128 in steps of 128 rows (the scales once a step's product), the last step partial (K 320)."""
    _check(bits, 12, 320, 72, 128, False, torch.float16)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("config", [None, (16, 32, 2, 0), (8, 256, 4, 0)],
                         ids=["default", "one_group_a_step", "groups_a_step"])
def test_contiguous_group_gemv(bits: int, config: tuple[int, int, int, int] | None) -> None:
    _check(bits, 3, 320, 40, 64, False, torch.float32, gemv_config=config)


@pytest.mark.parametrize("split_k", [2, 3, 100], ids=["even", "uneven", "one_step_each"])
def test_int8_gemv_split_k(split_k: int) -> None:
    _check(4, 2, 320, 40, 32, False, torch.float32, gemv_config=(16, 32, 2, 0), split_k=split_k)
    assert not arrival_counts(torch.device(DEVICE)).any(), "a split GEMV leaves every tile's arrival count at 0"


@pytest.mark.parametrize("split_k", [1, 3, 100], ids=["whole", "uneven", "one_step_each"])
def test_int8_expert_gemv_split_k(split_k: int) -> None:
    """Experts [E, K / 8, N], a (token, expert) pair a row with its expert picked in the kernel and K split among
    programs: each pair's token, as the kernel rounds it, against its expert's dequantized W."""
    k, n, group = 320, 40, 32
    experts = [_weights(4, k, n, group, False, torch.float32, seed=e) for e in range(3)]
    qweight, scales, zeros = (torch.stack([expert[i] for expert in experts]) for i in range(3))
    x = torch.randn(2, k, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    ids = torch.tensor([2, 0, 1, 2], device=DEVICE)
    out = wna16_expert_gemv(x, qweight, scales, zeros, 4, group, ids, 2, gemv_config=(16, 32, 2, 0), split_k=split_k)
    expected = torch.cat([quantize_q8_ref(x[pair // 2:pair // 2 + 1]) @ wna16_dequantize(*experts[expert], 4)
                          for pair, expert in enumerate(ids.tolist())])
    torch.testing.assert_close(out, expected, atol=TOLERANCE[torch.float32] * expected.abs().max().item(), rtol=0)
    assert not arrival_counts(torch.device(DEVICE)).any(), "a split GEMV leaves every tile's arrival count at 0"


def test_int8_gemv_of_rows_already_rounded() -> None:
    """x's row rounded to int8 before (by the norm kernel that wrote it) gives what rounding it here gives."""
    qweight, scales, zeros, g_idx = _weights(4, 512, 40, 128, False, torch.float16)
    x = torch.randn(1, 512, generator=torch.Generator().manual_seed(6)).to(DEVICE, torch.float16)
    out = wna16_int8_rows_matmul(quantize_q8(x, interleave=True), qweight, scales, zeros, 4, 128, x.dtype)
    assert out.dtype == x.dtype and torch.equal(out, wna16_matmul(x, qweight, scales, zeros, g_idx, 4, group=128))


def _check(bits: int, rows: int, k: int, n: int, group: int, shuffled: bool, dtype: torch.dtype,
           gemv_config: tuple[int, int, int, int] | None = None, split_k: int | None = None) -> None:
    qweight, scales, zeros, g_idx = _weights(bits, k, n, group, shuffled, dtype)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(5)).to(DEVICE, dtype)
    # A few rows of x against 4-bit W of contiguous groups take the int8 GEMV: its reference is x as it rounds x.
    int8_gemv = bits == 4 and rows <= GEMV_MAX_ROWS and not shuffled
    w = wna16_dequantize(qweight, scales.float(), zeros.float(), g_idx, bits)
    expected = (quantize_q8_ref(x) if int8_gemv else x.float()) @ w
    out = wna16_matmul(x, qweight, scales, zeros, g_idx, bits, group=None if shuffled else group,
                       gemv_config=gemv_config, split_k=split_k)
    assert out.dtype == dtype and out.shape == (rows, n)
    torch.testing.assert_close(out.float(), expected, atol=TOLERANCE[dtype] * expected.abs().max().item(), rtol=0)
    if int8_gemv:  # x's int8 runs cost what llama.cpp's do: within 2% of the largest output of the float product
        exact = x.float() @ w
        torch.testing.assert_close(out.float(), exact, atol=2e-2 * exact.abs().max().item(), rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("rows", [1, 7, 9, 40, 64, 500])
@pytest.mark.parametrize("shuffled", [False, True], ids=["sequential", "act_order"])
def test_gpu_bf16(bits: int, rows: int, shuffled: bool) -> None:
    _check(bits, rows, 4096, 1024, 128, shuffled, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("group", [32, 128, 4096])
def test_gpu_bf16_contiguous_groups_gemv(group: int) -> None:
    _check(4, 1, 4096, 1024, group, False, torch.bfloat16)
