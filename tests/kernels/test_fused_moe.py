"""The fused MoE kernel against the torch reference: decode and prefill sizes, experts left without tokens,
sizes that are not multiples of the tiles, fp8 experts with each kind of scales, 4- and 8-bit experts with group
scales and zero points (GPTQ/AWQ); each token's top-k rows summed (weighted)."""

from __future__ import annotations

import pytest
import torch

from wick.kernels import fused_moe
from wick.kernels.fused_moe import MoeTile, fused_experts
from wick.kernels.int8_activations import quantize_q8_ref
from wick.kernels.wna16_matmul import EXPERT_GEMV_CONFIG, pack_rows, takes_int8_activations
from wick.layers.moe.fp8_experts import Fp8Experts, fused_experts_fp8
from wick.layers.moe.fused_moe import fused_experts_ref
from wick.layers.moe.routing import select_experts
from wick.layers.moe.wna16_experts import EXPERT_GEMV_MAX_PAIRS, Wna16Experts, fused_experts_wna16

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_case(num_tokens: int, num_experts: int, top_k: int, hidden: int, inter: int, dtype: torch.dtype,
              device: str = DEVICE, used_experts: int | None = None):
    g = torch.Generator().manual_seed(num_tokens * 31 + num_experts)
    x = torch.randn(num_tokens, hidden, generator=g)
    w13 = torch.randn(num_experts, 2 * inter, hidden, generator=g) / hidden**0.5
    w2 = torch.randn(num_experts, hidden, inter, generator=g) / inter**0.5
    logits = torch.randn(num_tokens, num_experts, generator=g)
    if used_experts is not None:  # the other experts get no token
        logits[:, used_experts:] = -1e4
    weights, ids = select_experts(logits, top_k, renormalize=True)
    return (x.to(device, dtype), w13.to(device, dtype), w2.to(device, dtype), weights.to(device), ids.to(device))


@pytest.mark.parametrize(("num_tokens", "num_experts", "top_k"), [(1, 8, 2), (5, 8, 3), (40, 6, 2), (70, 16, 4)])
def test_matches_reference_fp32(num_tokens: int, num_experts: int, top_k: int) -> None:
    case = make_case(num_tokens, num_experts, top_k, hidden=32, inter=48, dtype=torch.float32)
    torch.testing.assert_close(fused_experts(*case), fused_experts_ref(*case), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("hidden", "tma", "descriptors"), [(32, True, 2), (30, True, 1), (32, False, 0)])
def test_b_tiles_by_tma_where_expert_rows_start_at_16_bytes(monkeypatch: pytest.MonkeyPatch, hidden: int, tma: bool,
                                                            descriptors: int) -> None:
    """fp32 experts over K = 30 (rows of 120 bytes) take the gate/up GEMM's B by pointers, the down GEMM's (K 48) by a
    tensor descriptor; both by descriptors over K = 32, and both by pointers without TMA (before Hopper). The same
    result every way."""
    if not tma:
        monkeypatch.setattr(fused_moe, "_has_tma", lambda device: False)
    made = []
    from_tensor = fused_moe.TensorDescriptor.from_tensor
    monkeypatch.setattr(fused_moe.TensorDescriptor, "from_tensor",
                        staticmethod(lambda *args, **kwargs: made.append(1) or from_tensor(*args, **kwargs)))
    case = make_case(40, 6, 2, hidden=hidden, inter=48, dtype=torch.float32)
    torch.testing.assert_close(fused_experts(*case), fused_experts_ref(*case), atol=1e-4, rtol=1e-4)
    assert len(made) == (descriptors if fused_moe._has_tma(case[0].device) else 0)


@pytest.mark.parametrize("direct_max_pairs", [0, 1 << 20])
def test_direct_and_sorted_tiles_match_reference(monkeypatch: pytest.MonkeyPatch, direct_max_pairs: int) -> None:
    """Both tilings on one case whose tokens share experts: a tile a pair, and pairs sorted by expert."""
    monkeypatch.setattr(fused_moe, "DIRECT_MAX_PAIRS", direct_max_pairs)
    monkeypatch.setattr(fused_moe, "DIRECT_PAIRS_PER_EXPERT", direct_max_pairs)
    case = make_case(12, 4, 2, hidden=32, inter=48, dtype=torch.float32)
    torch.testing.assert_close(fused_experts(*case), fused_experts_ref(*case), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("group_m", "tail_m"), [(0, 0), (1, 16), (3, 16), (4, 0)])
def test_grid_orders_and_tails_match_reference(group_m: int, tail_m: int) -> None:
    """Row tiles of 32 taken a column at a time or in groups of 1, 3 or 4 (the last group short), and tiles holding no
    more than 16 pairs multiplying 16 rows: 150 tokens over 8 experts, top 2, give the experts 29 to 44 pairs, so one
    tile of 29 and second tiles of 1 to 12."""
    case = make_case(150, 8, 2, hidden=32, inter=48, dtype=torch.float32)
    gate_up, down = MoeTile(32, 32, 32, 4, 1, group_m, tail_m), MoeTile(32, 16, 32, 4, 1, group_m, tail_m)
    torch.testing.assert_close(fused_experts(*case, config=(gate_up, down)), fused_experts_ref(*case), atol=1e-4,
                               rtol=1e-4)


def test_tiles_that_cannot_work_are_refused() -> None:
    case = make_case(150, 8, 2, hidden=32, inter=48, dtype=torch.float32)
    for tail_m in (32, 8, 24):  # not below BLOCK_M, below a dot's 16 rows, not a power of two
        tile = MoeTile(32, 32, 32, 4, 1, 0, tail_m)
        with pytest.raises(ValueError, match="tail"):
            fused_experts(*case, config=(tile, tile))
    with pytest.raises(ValueError, match="share the pairs' layout"):
        fused_experts(*case, config=(MoeTile(32, 32, 32, 4, 1), MoeTile(16, 32, 32, 4, 1)))


def test_experts_without_tokens() -> None:
    case = make_case(20, 16, 2, hidden=32, inter=16, dtype=torch.float32, used_experts=3)
    torch.testing.assert_close(fused_experts(*case), fused_experts_ref(*case), atol=1e-4, rtol=1e-4)


def test_fp16() -> None:
    case = make_case(24, 8, 2, hidden=64, inter=32, dtype=torch.float16)
    torch.testing.assert_close(fused_experts(*case), fused_experts_ref(*case), atol=1e-2, rtol=1e-2)


def to_fp8(w: torch.Tensor, block: tuple[int, int], dtype: torch.dtype) -> Fp8Experts:
    """w [E, N, K] in e4m3 with random scales over block tiles (a scale tile per shard: (I, K) for w13's gate and
    up)."""
    g = torch.Generator().manual_seed(w.shape[1])
    experts, n, k = w.shape
    scale = torch.rand(experts, -(-n // block[0]), -(-k // block[1]), generator=g) * 1e-2 + 1e-3
    data = (w.float().cpu() * 40).clamp(-448, 448).to(torch.float8_e4m3fn)
    return Fp8Experts(data.to(w.device), scale.to(w.device), block, dtype)


# (w13 block, w2 block) over hidden 160, intermediate 64: 128 x 128 tiles (partial ones at the edges), 32 x 32
# (BLOCK_K lowered to divide them), a scale a row, a scale a matrix (gate's, up's, down's)
FP8_BLOCKS = {"block128": ((128, 128), (128, 128)), "block32": ((32, 32), (32, 32)),
              "per_row": ((1, 160), (1, 64)), "per_tensor": ((64, 160), (160, 64))}


@pytest.mark.parametrize("blocks", FP8_BLOCKS.values(), ids=FP8_BLOCKS.keys())
@pytest.mark.parametrize("num_tokens", [3, 40])
def test_fp8_experts_match_reference(blocks: tuple[tuple[int, int], tuple[int, int]], num_tokens: int) -> None:
    """fp8 experts against the reference over the same experts converted; 3 tokens a tile a pair, 40 sorted."""
    x, w13, w2, weights, ids = make_case(num_tokens, 6, 2, hidden=160, inter=64, dtype=torch.float32)
    f13, f2 = to_fp8(w13, blocks[0], x.dtype), to_fp8(w2, blocks[1], x.dtype)
    expected = fused_experts_ref(x, f13, f2, weights, ids)
    out = fused_experts(x, f13.data, f2.data, weights, ids, w13_scales=f13.scales, w2_scales=f2.scales)
    torch.testing.assert_close(out, expected, atol=1e-4 * expected.abs().max().item(), rtol=1e-4)


@pytest.mark.parametrize("blocks", FP8_BLOCKS.values(), ids=FP8_BLOCKS.keys())
@pytest.mark.parametrize("path", ["gemv", "tiles"])
def test_fp8_expert_paths_match_reference(blocks: tuple[tuple[int, int], tuple[int, int]], path: str) -> None:
    """The layer's two paths over fp8 experts: the GEMVs (a pair a row, its expert chosen inside) and the tiles."""
    x, w13, w2, weights, ids = make_case(5, 6, 2, hidden=160, inter=64, dtype=torch.float32)
    f13, f2 = to_fp8(w13, blocks[0], x.dtype), to_fp8(w2, blocks[1], x.dtype)
    expected = fused_experts_ref(x, f13, f2, weights, ids)
    out = fused_experts_fp8(x, f13, f2, weights, ids, path)
    torch.testing.assert_close(out, expected, atol=1e-4 * expected.abs().max().item(), rtol=1e-4)


def test_fp8_expert_gemv_steps_past_a_partial_scale_tile() -> None:
    """Hidden 1,000: the GEMV's steps of 1,024 and 256 columns end inside a partial 128-wide scale tile."""
    x, w13, w2, weights, ids = make_case(2, 4, 2, hidden=1000, inter=256, dtype=torch.float32)
    f13, f2 = to_fp8(w13, (128, 128), x.dtype), to_fp8(w2, (128, 128), x.dtype)
    expected = fused_experts_ref(x, f13, f2, weights, ids)
    out = fused_experts_fp8(x, f13, f2, weights, ids, "gemv")
    torch.testing.assert_close(out, expected, atol=1e-4 * expected.abs().max().item(), rtol=1e-4)


def test_fp8_scale_tiles_off_powers_of_two_take_the_tiles() -> None:
    """96-wide scale tiles: no GEMV steps whole ones, so the layer's path is the tiles (BLOCK_K 32)."""
    x, w13, w2, weights, ids = make_case(3, 6, 2, hidden=192, inter=96, dtype=torch.float32)
    f13, f2 = to_fp8(w13, (96, 96), x.dtype), to_fp8(w2, (96, 96), x.dtype)
    expected = fused_experts_ref(x, f13, f2, weights, ids)
    torch.testing.assert_close(fused_experts_fp8(x, f13, f2, weights, ids), expected,
                               atol=1e-4 * expected.abs().max().item(), rtol=1e-4)
    with pytest.raises(ValueError, match="no gemv path"):
        fused_experts_fp8(x, f13, f2, weights, ids, "gemv")


def to_wna16(w: torch.Tensor, bits: int, group: int) -> Wna16Experts:
    """Random experts of w's shape [E, N, K] in `bits` with groups of `group` rows of K (group >= K: one a column):
    random values, zero points and scales, the weights within about w's range."""
    g = torch.Generator().manual_seed(w.shape[1] + bits)
    experts, n, k = w.shape
    groups = -(-k // group)
    q = torch.randint(0, 1 << bits, (experts, k, n), generator=g)
    zeros = torch.randint(0, 1 << bits, (experts, groups, n), generator=g)
    scales = (torch.rand(experts, groups, n, generator=g) + 0.5) * 2 / (k**0.5 * (1 << bits))
    qweight = torch.stack([pack_rows(values, bits) for values in q])
    return Wna16Experts(qweight.to(w.device), scales.to(w.device, w.dtype), zeros.to(w.device, w.dtype), bits,
                        min(group, k))


# (bits, w13 group, w2 group) over hidden 160, intermediate 64: groups of 128 (a partial one at the end of w13's K),
# groups of 32 (BLOCK_K lowered to them), a group a column (K) in 8 bits
WNA16_GROUPS = {"4bit_g128": (4, 128, 128), "4bit_g32": (4, 32, 32), "8bit_channel": (8, 160, 64)}


def gemv_ref(x: torch.Tensor, w13: Wna16Experts, w2: Wna16Experts, topk_weights: torch.Tensor,
             topk_ids: torch.Tensor) -> torch.Tensor:
    """The reference with each expert's input rounded to int8 in runs of 32 (quantize_q8_ref) where the GEMV over
    its weights takes int8 activations."""

    def rounded(rows: torch.Tensor, experts: Wna16Experts) -> torch.Tensor:
        _, _, k = experts.shape
        int8 = takes_int8_activations(experts.bits, experts.group, k, EXPERT_GEMV_CONFIG[1])
        return quantize_q8_ref(rows) if int8 else rows.float()

    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for pair, expert in enumerate(topk_ids.flatten().tolist()):
        token = pair // topk_ids.shape[1]
        gate, up = (rounded(x[token:token + 1], w13) @ w13[expert].float().t()).chunk(2, dim=-1)
        hidden = (torch.nn.functional.silu(gate) * up).to(x.dtype)
        out[token] += topk_weights.flatten()[pair] * (rounded(hidden, w2) @ w2[expert].float().t())[0]
    return out.to(x.dtype)


@pytest.mark.parametrize("groups", WNA16_GROUPS.values(), ids=WNA16_GROUPS.keys())
@pytest.mark.parametrize(("num_tokens", "path"), [(3, "gemv"), (3, "tiles"), (40, "tiles")])
def test_wna16_experts_match_reference(groups: tuple[int, int, int], num_tokens: int, path: str) -> None:
    """4- and 8-bit experts against the reference over the same experts dequantized: the GEMVs (a pair a row, its
    expert chosen inside; 4-bit groups of whole 32-row runs take int8 activations: w13 over hidden 160 in groups of
    128 does not, w2 in groups of 64 and both in groups of 32 do), and the tiles a pair each (3 tokens) and sorted
    by expert (40)."""
    x, w13, w2, weights, ids = make_case(num_tokens, 6, 2, hidden=160, inter=64, dtype=torch.float32)
    bits, group13, group2 = groups
    q13, q2 = to_wna16(w13, bits, group13), to_wna16(w2, bits, group2)
    expected = (gemv_ref if path == "gemv" else fused_experts_ref)(x, q13, q2, weights, ids)
    out = fused_experts_wna16(x, q13, q2, weights, ids, path)
    torch.testing.assert_close(out, expected, atol=1e-4 * expected.abs().max().item(), rtol=1e-4)


@pytest.mark.parametrize(("group_m", "tail_m"), [(0, 16), (4, 16)])
def test_wna16_grid_orders_and_tails_match_reference(group_m: int, tail_m: int) -> None:
    """4-bit experts in groups of 16 over test_grid_orders_and_tails_match_reference's routing (one tile of 29 pairs,
    second tiles of 1 to 12)."""
    x, w13, w2, weights, ids = make_case(150, 8, 2, hidden=32, inter=48, dtype=torch.float32)
    q13, q2 = to_wna16(w13, 4, 16), to_wna16(w2, 4, 16)
    tiles = (MoeTile(32, 32, 16, 4, 1, group_m, tail_m), MoeTile(32, 16, 16, 4, 1, group_m, tail_m))
    expected = fused_experts_ref(x, q13, q2, weights, ids)
    out = fused_experts(x, q13.qweight, q2.qweight, weights, ids, tiles, q13.group_scales, q2.group_scales)
    torch.testing.assert_close(out, expected, atol=1e-4 * expected.abs().max().item(), rtol=1e-4)


@pytest.mark.parametrize("num_tokens", [3, 40])
def test_wna16_tiles_end_in_a_partial_step(num_tokens: int) -> None:
    """Hidden 176 and intermediate 48 a group each (per channel): the last 32-row step of either GEMM is partial."""
    x, w13, w2, weights, ids = make_case(num_tokens, 5, 2, hidden=176, inter=48, dtype=torch.float32)
    q13, q2 = to_wna16(w13, 4, 176), to_wna16(w2, 4, 48)
    expected = fused_experts_ref(x, q13, q2, weights, ids)
    out = fused_experts_wna16(x, q13, q2, weights, ids, "tiles")
    torch.testing.assert_close(out, expected, atol=1e-4 * expected.abs().max().item(), rtol=1e-4)


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("num_tokens", [1, 7, 256, 2048])
def test_qwen3_moe_shapes_bf16_cuda(num_tokens: int) -> None:
    # Qwen3-30B-A3B: 128 experts, top 8, hidden 2048, expert intermediate 768
    case = make_case(num_tokens, 128, 8, hidden=2048, inter=768, dtype=torch.bfloat16, device="cuda")
    x, w13, w2, weights, ids = case
    expected = fused_experts_ref(x.float(), w13.float(), w2.float(), weights, ids)
    torch.testing.assert_close(fused_experts(*case).float(), expected, atol=3e-2, rtol=3e-2)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("num_tokens", [1, 7, 256, 2048])
@pytest.mark.parametrize("block", [(128, 128), None], ids=["block128", "per_row"])
def test_qwen3_moe_shapes_fp8_cuda(num_tokens: int, block: tuple[int, int] | None) -> None:
    x, w13, w2, weights, ids = make_case(num_tokens, 128, 8, hidden=2048, inter=768, dtype=torch.bfloat16,
                                         device="cuda")
    f13, f2 = to_fp8(w13, block or (1, 2048), x.dtype), to_fp8(w2, block or (1, 768), x.dtype)
    expected = fused_experts_ref(x.float(), f13.dequantize_all().float(), f2.dequantize_all().float(), weights, ids)
    for path in ("gemv", "tiles"):
        out = fused_experts_fp8(x, f13, f2, weights, ids, path)
        torch.testing.assert_close(out.float(), expected, atol=1e-2 * expected.abs().max().item(), rtol=3e-2)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("num_tokens", [1, 7, 256, 2048])
@pytest.mark.parametrize("bits", [4, 8])
def test_qwen3_moe_shapes_wna16_cuda(num_tokens: int, bits: int) -> None:
    """Qwen3-30B-A3B's experts as its GPTQ checkpoints hold them (groups of 128): the tiles, and the GEMVs where they
    run (4 bits: against int8 activations)."""
    x, w13, w2, weights, ids = make_case(num_tokens, 128, 8, hidden=2048, inter=768, dtype=torch.bfloat16,
                                         device="cuda")
    q13, q2 = to_wna16(w13, bits, 128), to_wna16(w2, bits, 128)
    expected = fused_experts_ref(x.float(), q13.dequantize_all().float(), q2.dequantize_all().float(), weights, ids)
    out = fused_experts_wna16(x, q13, q2, weights, ids, "tiles")
    torch.testing.assert_close(out.float(), expected, atol=1e-2 * expected.abs().max().item(), rtol=3e-2)
    if num_tokens * 8 <= EXPERT_GEMV_MAX_PAIRS:
        expected = gemv_ref(x.float(), q13, q2, weights, ids)
        out = fused_experts_wna16(x, q13, q2, weights, ids, "gemv")
        torch.testing.assert_close(out.float(), expected, atol=1e-2 * expected.abs().max().item(), rtol=3e-2)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("num_tokens", [3, 20, 300])
def test_mixtral_shapes_bf16_cuda(num_tokens: int) -> None:
    """8 experts, top 2: a tile a pair up to 16 pairs, sorted past them."""
    case = make_case(num_tokens, 8, 2, hidden=4096, inter=1792, dtype=torch.bfloat16, device="cuda")
    x, w13, w2, weights, ids = case
    expected = fused_experts_ref(x.float(), w13.float(), w2.float(), weights, ids)
    torch.testing.assert_close(fused_experts(*case).float(), expected, atol=3e-2, rtol=3e-2)
