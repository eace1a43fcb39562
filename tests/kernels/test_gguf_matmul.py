"""The GGUF dequantize-in-kernel matmul against x @ W^T over the torch dequantizers (the reference)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType

from wick.kernels import gguf_matmul as gguf_matmul_module
from wick.kernels.gemv_split import _arrival_counts as arrival_counts
from wick.kernels.gguf_int8_gemv import _int8_gemv, runs_int8_gemv
from wick.kernels.gguf_k_gemv import _k_q8_gemv_kernel, _q4_k_q8_tma_gemv_kernel
from wick.kernels.gguf_matmul import (
    GEMV_MAX_ROWS,
    TRITON_TYPES,
    gguf_dequantize,
    gguf_expert_gemv,
    gguf_int8_rows_matmul,
    gguf_matmul,
    runs_expert_int8_gemv,
)
from wick.kernels.int8_activations import quantize_q8, quantize_q8_ref
from wick.kernels.pdl import hopper_or_later
from wick.loader.gguf_dequant import BLOCK_TYPES, dequantize

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "layers" / "quantization"))
from gguf_blocks import random_gguf  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}
INT8_TYPES = [GGMLQuantizationType.Q3_K, GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q5_K,
              GGMLQuantizationType.Q6_K, GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_0,
              GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q5_0, GGMLQuantizationType.Q5_1,
              GGMLQuantizationType.Q2_K, GGMLQuantizationType.IQ4_NL, GGMLQuantizationType.IQ4_XS]


def _check(qtype: GGMLQuantizationType, rows: int, n: int, k: int, dtype: torch.dtype) -> None:
    weight = random_gguf(qtype, n, k, seed=int(qtype))
    data = weight.data.to(DEVICE)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(2)).to(DEVICE, dtype)
    # A few rows of x against the types with int8 GEMVs take them: their reference is x as they quantize x.
    int8_gemv = runs_int8_gemv(qtype, data) and rows <= GEMV_MAX_ROWS
    x_seen = quantize_q8_ref(x) if int8_gemv else x.float()
    expected = x_seen @ dequantize(data, qtype, (n, k)).t()
    out = gguf_matmul(x, data, qtype, (n, k))
    assert out.dtype == dtype and out.shape == (rows, n)
    scale = expected.abs().max().item()
    torch.testing.assert_close(out.float(), expected, atol=TOLERANCE[dtype] * scale, rtol=0)


def test_every_quantized_type_the_loader_reads_decodes_in_triton() -> None:
    assert TRITON_TYPES == BLOCK_TYPES


@pytest.mark.parametrize("qtype", sorted(TRITON_TYPES), ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [1, GEMV_MAX_ROWS + 3])
def test_every_type_gemv_and_tiled(qtype: GGMLQuantizationType, rows: int) -> None:
    k = 512 if qtype >= GGMLQuantizationType.Q2_K else 96
    _check(qtype, rows, 40, k, torch.float32)


@pytest.mark.parametrize("qtype", INT8_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize(("config", "split_k"), [(None, None), ((8, 2, 2, 0), None), ((1, 1, 1, 0), None),
                                               ((8, 1, 1, 0), 2), ((8, 1, 1, 0), 3), ((8, 1, 1, 0), 100)],
                         ids=["default", "8x2", "1x1", "split_3_2", "split_2_2_1", "split_one_block_each"])
def test_int8_gemv(qtype: GGMLQuantizationType, config: tuple[int, int, int, int] | None,
                   split_k: int | None) -> None:
    n, k = 24, 1280
    weight = random_gguf(qtype, n, k, seed=7)
    data = weight.data.to(DEVICE)
    x = torch.randn(2, k, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    w = dequantize(data, qtype, (n, k))
    expected = quantize_q8_ref(x) @ w.t()
    out = gguf_matmul(x, data, qtype, (n, k), gemv_config=config, split_k=split_k)
    torch.testing.assert_close(out, expected, atol=1e-4 * expected.abs().max().item(), rtol=0)
    assert not arrival_counts(out.device).any(), "a split GEMV leaves every tile's arrival count at 0"
    # x's int8 runs cost what llama.cpp's do: within 2% of the largest output of the float product
    exact = x @ w.t()
    torch.testing.assert_close(out, exact, atol=2e-2 * exact.abs().max().item(), rtol=0)


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K], ids=lambda t: t.name)
def test_int8_gemv_of_rows_already_rounded(qtype: GGMLQuantizationType) -> None:
    """x's rows rounded to int8 before (by the norm kernel that wrote them) give what rounding them here gives."""
    n, k = 24, 512
    data = random_gguf(qtype, n, k, seed=8).data.to(DEVICE)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(4)).to(DEVICE, torch.float16)
    out = gguf_int8_rows_matmul(quantize_q8(x), data, qtype, n, x.dtype)
    assert out.dtype == x.dtype and torch.equal(out, gguf_matmul(x, data, qtype, (n, k)))


def _off_word_boundaries(data: torch.Tensor, offset: int) -> torch.Tensor:
    """data's rows `offset` bytes into wider ones, on DEVICE: the int8 GEMVs cannot read them."""
    padded = torch.zeros(data.shape[0], data.shape[1] + offset, dtype=torch.uint8)
    padded[:, offset:] = data
    return padded.to(DEVICE)[:, offset:]


def test_every_quantized_type_has_an_int8_gemv() -> None:
    assert set(INT8_TYPES) == BLOCK_TYPES
    assert all(runs_int8_gemv(qtype, random_gguf(qtype, 8, 256, seed=1).data) for qtype in INT8_TYPES)


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q2_K, GGMLQuantizationType.IQ4_NL], ids=lambda t: t.name)
@pytest.mark.parametrize(("config", "split_k"), [((8, 2, 2, 0), None), ((16, 1, 1, 0), 3), ((8, 2, 2, 0), 100)],
                         ids=["8x2", "split_3", "split_one_step_each"])
def test_float_gemv(qtype: GGMLQuantizationType, config: tuple[int, int, int, int], split_k: int | None) -> None:
    """Rows the int8 GEMVs cannot read take the float GEMV: x as it is, K split or not."""
    n, k = 24, 1280
    weight = random_gguf(qtype, n, k, seed=15)
    data = _off_word_boundaries(weight.data, 1)
    assert not runs_int8_gemv(qtype, data)
    x = torch.randn(2, k, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    expected = x @ dequantize(weight.data, qtype, (n, k)).t().to(DEVICE)
    out = gguf_matmul(x, data, qtype, (n, k), gemv_config=config, split_k=split_k)
    torch.testing.assert_close(out, expected, atol=1e-4 * expected.abs().max().item(), rtol=0)
    assert not arrival_counts(out.device).any(), "a split GEMV leaves every tile's arrival count at 0"


@pytest.mark.parametrize(("qtype", "offset"), [(GGMLQuantizationType.Q3_K, 1), (GGMLQuantizationType.Q4_K, 2),
                                               (GGMLQuantizationType.Q5_K, 2), (GGMLQuantizationType.Q6_K, 1),
                                               (GGMLQuantizationType.Q8_0, 1), (GGMLQuantizationType.Q5_1, 1),
                                               (GGMLQuantizationType.IQ4_XS, 2)],
                         ids=["q3_k", "q4_k", "q5_k", "q6_k", "q8_0", "q5_1", "iq4_xs"])
def test_rows_off_word_boundaries_take_the_byte_kernel(qtype: GGMLQuantizationType, offset: int) -> None:
    n, k = 8, 256
    weight = random_gguf(qtype, n, k, seed=8)
    data = _off_word_boundaries(weight.data, offset)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    # the float product: the int8 GEMVs would be 1e-2 away
    expected = x @ dequantize(weight.data, qtype, (n, k)).t().to(DEVICE)
    torch.testing.assert_close(gguf_matmul(x, data, qtype, (n, k)), expected,
                               atol=1e-4 * expected.abs().max().item(), rtol=0)


def _contiguous_from(data: torch.Tensor, offset: int) -> torch.Tensor:
    """data's bytes, contiguous, `offset` bytes past an allocation's start, on DEVICE."""
    buffer = torch.zeros(data.numel() + offset, dtype=torch.uint8)
    buffer[offset:] = data.flatten()
    return buffer.to(DEVICE)[offset:].view(data.shape)


@pytest.mark.parametrize("split_k", [None, 3])
def test_q4_k_gemv_of_rows_past_the_last_tile(split_k: int | None) -> None:
    """13 rows of Q4_K W in tiles of 8, dense and three experts of them: the last tile's rows past W's (read as zeros
    by TMA) and past an expert's (the next expert's) are not stored."""
    qtype, n, k = GGMLQuantizationType.Q4_K, 13, 1536
    weights = [random_gguf(qtype, n, k, seed=50 + e) for e in range(3)]
    x = torch.randn(2, k, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    x_seen = quantize_q8_ref(x)
    dense = dequantize(weights[0].data, qtype, (n, k)).to(DEVICE)
    expected = x_seen @ dense.t()
    out = gguf_matmul(x, weights[0].data.to(DEVICE), qtype, (n, k), split_k=split_k)
    torch.testing.assert_close(out, expected, atol=1e-4 * expected.abs().max().item(), rtol=0)
    ids = torch.tensor([1, 0, 2, 1], dtype=torch.int32, device=DEVICE)
    data = torch.stack([w.data for w in weights]).to(DEVICE)
    out = gguf_expert_gemv(x, data, qtype, k, ids, 2, split_k)
    expected = torch.stack([x_seen[p // 2] @ dequantize(weights[e].data, qtype, (n, k)).to(DEVICE).t()
                            for p, e in enumerate(ids.tolist())])
    torch.testing.assert_close(out, expected, atol=1e-4 * expected.abs().max().item(), rtol=0)


@pytest.mark.parametrize("split_k", [None, 2])
@pytest.mark.parametrize("layout", ["strided", "contiguous"])
def test_q4_k_rows_off_16_byte_bounds_take_the_gemv_that_loads_them(layout: str, split_k: int | None) -> None:
    """Q4_K rows on word bounds but not 16-byte ones (in wider rows, or contiguous from 4 bytes past a bound) cannot
    come by TMA: the int8 GEMV that loads its blocks itself (the one GPUs before Hopper run for every Q4_K tensor)
    takes them, to the same product."""
    qtype, n, k = GGMLQuantizationType.Q4_K, 24, 1280
    weight = random_gguf(qtype, n, k, seed=7)
    data = _off_word_boundaries(weight.data, 4) if layout == "strided" else _contiguous_from(weight.data, 4)
    assert _int8_gemv(qtype, data)[0] is _k_q8_gemv_kernel
    x = torch.randn(2, k, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    expected = quantize_q8_ref(x) @ dequantize(weight.data, qtype, (n, k)).t().to(DEVICE)
    out = gguf_matmul(x, data, qtype, (n, k), split_k=split_k)
    torch.testing.assert_close(out, expected, atol=1e-4 * expected.abs().max().item(), rtol=0)


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q8_0], ids=lambda t: t.name)
def test_half_precision(qtype: GGMLQuantizationType) -> None:
    _check(qtype, 17, 24, 256, torch.float16)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("qtype", sorted(TRITON_TYPES), ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [1, 4, 64, 300])
def test_gpu_bf16_shapes(qtype: GGMLQuantizationType, rows: int) -> None:
    _check(qtype, rows, 1000, 4096, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q6_K, GGMLQuantizationType.Q8_0], ids=lambda t: t.name)
def test_gpu_gemma3_lm_head(qtype: GGMLQuantizationType) -> None:
    """Gemma 3's tied embedding as its GGUF files pack it: 262,208 rows, more tiles of 4 than a grid's second
    dimension holds."""
    _check(qtype, 1, 262208, 256, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_q4_k_gemv_replays_in_a_cuda_graph() -> None:
    """The Q4_K GEMV captured in a CUDA graph (on Hopper its blocks come through descriptors the capture keeps),
    dense and over experts, replays with new x and new experts as it runs eagerly."""
    qtype, n, k = GGMLQuantizationType.Q4_K, 1003, 4096  # tiles of 8 rows: the last past W's, an expert's past its
    data = random_gguf(qtype, n, k, seed=40).data.to(DEVICE)
    experts = torch.stack([random_gguf(qtype, 250, 1024, seed=41 + e).data for e in range(4)]).to(DEVICE)
    if hopper_or_later(data.device):
        assert _int8_gemv(qtype, data)[0] is _int8_gemv(qtype, experts)[0] is _q4_k_q8_tma_gemv_kernel
    x = torch.randn(1, k, device=DEVICE, dtype=torch.bfloat16)
    x_pairs = torch.randn(2, 1024, device=DEVICE, dtype=torch.bfloat16)
    ids = torch.tensor([3, 1, 0, 2], dtype=torch.int32, device=DEVICE)

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        return gguf_matmul(x, data, qtype, (n, k)), gguf_expert_gemv(x_pairs, experts, qtype, 1024, ids, 2)

    run()  # compiled and its arrival counts made before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    generator = torch.Generator(device=DEVICE).manual_seed(3)
    for _ in range(3):
        x.normal_(generator=generator)
        x_pairs.normal_(generator=generator)
        ids.copy_(torch.randperm(4, generator=generator, device=DEVICE))
        graph.replay()
        for got, expected in zip(captured, run(), strict=True):
            assert torch.equal(got, expected)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("qtype", sorted(TRITON_TYPES), ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [20, 64, 128, 200])
def test_gpu_tile_kernel_bf16(qtype: GGMLQuantizationType, rows: int) -> None:
    n, k = 300, 1024
    weight = random_gguf(qtype, n, k, seed=14)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(11)).to(DEVICE, torch.bfloat16)
    expected = x.float() @ dequantize(weight.data, qtype, (n, k)).t().to(DEVICE)
    out = gguf_matmul(x, weight.data.to(DEVICE), qtype, (n, k), tile_max_rows=256)
    torch.testing.assert_close(out.float(), expected, atol=TOLERANCE[torch.bfloat16] * expected.abs().max().item(),
                               rtol=0)


@pytest.mark.parametrize("qtype", sorted(TRITON_TYPES), ids=lambda t: t.name)
def test_dequantize_kernel_matches_the_torch_dequantizer(qtype: GGMLQuantizationType) -> None:
    n, k = 20, 512
    weight = random_gguf(qtype, n, k, seed=11)
    expected = dequantize(weight.data, qtype, (n, k))
    out = gguf_dequantize(weight.data.to(DEVICE), qtype, (n, k), torch.float32)
    # the same float32 operations; a GPU may fuse a multiply and an add
    torch.testing.assert_close(out.cpu(), expected, atol=1e-6 * expected.abs().max().item(), rtol=0)


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q8_0], ids=lambda t: t.name)
def test_many_rows_multiply_the_dequantized_weight(qtype: GGMLQuantizationType) -> None:
    n, k, rows = 24, 512, GEMV_MAX_ROWS + 1
    weight = random_gguf(qtype, n, k, seed=12)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    expected = x @ dequantize(weight.data, qtype, (n, k)).t().to(DEVICE)
    out = gguf_matmul(x, weight.data.to(DEVICE), qtype, (n, k), tile_max_rows=0)
    torch.testing.assert_close(out, expected, atol=1e-4 * expected.abs().max().item(), rtol=0)


Q4_K, Q5_K, Q6_K, Q8_0 = INT8_TYPES[1:5]
Q4_Q5_TYPES = [GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q5_0,
               GGMLQuantizationType.Q5_1]
HALF_BLOCK_TYPES = [GGMLQuantizationType.Q2_K, GGMLQuantizationType.Q3_K]
IQ4_TYPES = [GGMLQuantizationType.IQ4_XS, GGMLQuantizationType.IQ4_NL]


@pytest.mark.parametrize(("qtype", "rows", "n", "k", "config", "split_k"), [
    (Q4_K, GEMV_MAX_ROWS + 1, 40, 512, None, None),
    (Q4_K, 33, 24, 1280, (16, 16, 64, 4, 2), 1),
    (Q4_K, 20, 70, 768, (32, 32, 256, 4, 2), 1),
    (Q4_K, 17, 64, 1024, (16, 64, 128, 4, 3), 1),
    (Q4_K, 40, 48, 1280, (16, 16, 64, 4, 2), 3),
    (Q4_K, 12, 40, 1024, (16, 32, 128, 4, 2), 100),
    (Q4_K, 200, 72, 512, None, None),
    (Q5_K, GEMV_MAX_ROWS + 1, 40, 512, None, None),
    (Q5_K, 33, 24, 1280, (16, 16, 64, 4, 2), 1),
    (Q5_K, 40, 48, 1280, (16, 16, 64, 4, 2), 3),
    (Q6_K, GEMV_MAX_ROWS + 1, 40, 512, None, None),
    (Q6_K, 33, 24, 1280, (16, 16, 128, 4, 2), 1),
    (Q6_K, 20, 70, 768, (32, 32, 256, 4, 2), 1),
    (Q6_K, 40, 48, 1280, (16, 16, 128, 4, 2), 3),
    (Q6_K, 120, 72, 512, None, None),
    (Q8_0, GEMV_MAX_ROWS + 1, 40, 512, None, None),
    (Q8_0, 33, 24, 1280, (16, 16, 64, 4, 2), 1),
    (Q8_0, 20, 70, 768, (32, 32, 256, 4, 2), 1),
    (Q8_0, 40, 48, 1280, (16, 16, 128, 4, 2), 3),
    (Q8_0, 120, 72, 512, None, None),
    *((qtype, 33, 24, 1280, (16, 16, 64, 4, 2), 1) for qtype in Q4_Q5_TYPES),
    *((qtype, 20, 70, 768, (32, 32, 256, 4, 2), 3) for qtype in Q4_Q5_TYPES),
    *((qtype, 33, 24, 1280, (16, 16, 128, 4, 2), 1) for qtype in HALF_BLOCK_TYPES),
    *((qtype, 20, 70, 768, (32, 32, 256, 4, 2), 3) for qtype in HALF_BLOCK_TYPES),
    *((qtype, 33, 24, 1280, (16, 16, 64, 4, 2), 1) for qtype in IQ4_TYPES),
    *((qtype, 20, 70, 768, (32, 32, 128, 4, 2), 3) for qtype in IQ4_TYPES),
], ids=["q4_k_default", "q4_k_step_64_rows_past_tiles", "q4_k_step_256_ragged_n", "q4_k_two_steps_a_block",
        "q4_k_split_3", "q4_k_split_one_step_each", "q4_k_largest_tile", "q5_k_default", "q5_k_step_64_rows_past_tiles",
        "q5_k_split_3", "q6_k_default", "q6_k_step_128",
        "q6_k_step_256_ragged_n", "q6_k_split_3", "q6_k_largest_tile", "q8_0_default", "q8_0_step_64",
        "q8_0_step_256_ragged_n", "q8_0_split_3", "q8_0_largest_tile",
        *(f"{t.name.lower()}_step_64" for t in Q4_Q5_TYPES),
        *(f"{t.name.lower()}_step_256_split_3" for t in Q4_Q5_TYPES),
        *(f"{t.name.lower()}_step_128" for t in HALF_BLOCK_TYPES),
        *(f"{t.name.lower()}_step_256_split_3" for t in HALF_BLOCK_TYPES),
        *(f"{t.name.lower()}_step_64" for t in IQ4_TYPES),
        *(f"{t.name.lower()}_step_128_split_3" for t in IQ4_TYPES)])
def test_tile_kernel(monkeypatch: pytest.MonkeyPatch, qtype: GGMLQuantizationType, rows: int, n: int, k: int,
                     config: tuple[int, int, int, int, int] | None, split_k: int | None) -> None:
    calls = []
    tile_matmul = gguf_matmul_module.tile_matmul
    monkeypatch.setattr(gguf_matmul_module, "tile_matmul", lambda *args: calls.append(1) or tile_matmul(*args))
    weight = random_gguf(qtype, n, k, seed=13)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(8)).to(DEVICE)
    expected = x @ dequantize(weight.data, qtype, (n, k)).t().to(DEVICE)
    for _ in range(2):  # the second call meets the arrival counts the first left
        out = gguf_matmul(x, weight.data.to(DEVICE), qtype, (n, k), tile_config=config, split_k=split_k,
                          tile_max_rows=256)
        assert out.shape == (rows, n)
        torch.testing.assert_close(out, expected, atol=1e-5 * expected.abs().max().item(), rtol=0)
    assert len(calls) == 2  # the tile kernel ran, not W decoded whole
    assert not arrival_counts(torch.device(DEVICE)).any()


@pytest.mark.parametrize("split_k", [None, 3])
@pytest.mark.parametrize("qtype", sorted(TRITON_TYPES), ids=lambda t: t.name)
def test_expert_gemv(qtype: GGMLQuantizationType, split_k: int | None) -> None:
    """Each (token, expert) pair's row against its expert, K split or not: x as the int8 GEMVs round it, or as it
    is."""
    experts, n, k, tokens, top_k = 3, 24, 512, 3, 2
    weights = [random_gguf(qtype, n, k, seed=20 + e) for e in range(experts)]
    data = torch.stack([w.data for w in weights]).to(DEVICE)
    ids = torch.tensor([2, 0, 1, 1, 0, 2], dtype=torch.int32, device=DEVICE)
    x = torch.randn(tokens, k, generator=torch.Generator().manual_seed(9)).to(DEVICE)
    out = gguf_expert_gemv(x, data, qtype, k, ids, top_k, split_k)
    x_seen = quantize_q8_ref(x) if runs_int8_gemv(qtype, weights[0].data) else x
    expected = torch.stack([x_seen[p // top_k] @ dequantize(weights[e].data, qtype, (n, k)).to(DEVICE).t()
                            for p, e in enumerate(ids.tolist())])
    torch.testing.assert_close(out, expected, atol=1e-4 * expected.abs().max().item(), rtol=0)


def test_expert_gemv_of_rows_already_rounded() -> None:
    """The pairs' rows rounded to int8 before (by the activation kernel that wrote them) give what rounding them here
    gives."""
    qtype, experts, n, k = GGMLQuantizationType.Q4_K, 3, 24, 512
    data = torch.stack([random_gguf(qtype, n, k, seed=30 + e).data for e in range(experts)]).to(DEVICE)
    ids = torch.tensor([2, 0, 1, 1], dtype=torch.int32, device=DEVICE)
    x = torch.randn(4, k, generator=torch.Generator().manual_seed(10)).to(DEVICE, torch.float16)
    assert runs_expert_int8_gemv(data, qtype) == data.is_cuda  # experts run packed on a GPU only
    out = gguf_expert_gemv(quantize_q8(x), data, qtype, k, ids, 1, dtype=x.dtype)
    assert out.dtype == x.dtype and torch.equal(out, gguf_expert_gemv(x, data, qtype, k, ids, 1))
