"""The fused MoE kernel against the torch reference: decode and prefill sizes, experts left without tokens,
sizes that are not multiples of the tiles; moe_align's layout; each token's top-k rows summed (weighted)."""

from __future__ import annotations

import pytest
import torch

from wick.kernels import fused_moe
from wick.kernels.fused_moe import fused_experts, moe_align, sum_pairs
from wick.layers.moe.fused_moe import fused_experts_ref
from wick.layers.moe.routing import select_experts

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


@pytest.mark.parametrize("direct_max_pairs", [0, 1 << 20])
def test_direct_and_sorted_tiles_match_reference(monkeypatch: pytest.MonkeyPatch, direct_max_pairs: int) -> None:
    """Both tilings on one case whose tokens share experts: a tile a pair, and pairs sorted by expert."""
    monkeypatch.setattr(fused_moe, "DIRECT_MAX_PAIRS", direct_max_pairs)
    case = make_case(12, 4, 2, hidden=32, inter=48, dtype=torch.float32)
    torch.testing.assert_close(fused_experts(*case), fused_experts_ref(*case), atol=1e-4, rtol=1e-4)


def test_experts_without_tokens() -> None:
    case = make_case(20, 16, 2, hidden=32, inter=16, dtype=torch.float32, used_experts=3)
    torch.testing.assert_close(fused_experts(*case), fused_experts_ref(*case), atol=1e-4, rtol=1e-4)


def test_fp16() -> None:
    case = make_case(24, 8, 2, hidden=64, inter=32, dtype=torch.float16)
    torch.testing.assert_close(fused_experts(*case), fused_experts_ref(*case), atol=1e-2, rtol=1e-2)


def test_moe_align_layout() -> None:
    ids = torch.tensor([[0, 3], [3, 1], [3, 0], [2, 3]])
    sorted_ids, block_expert, num_padded = moe_align(ids, num_experts=5, block_m=2)
    num_pairs = ids.numel()
    rows = num_padded.item()
    assert rows == 2 + 2 + 2 + 4  # experts 0, 1, 2 padded to 2 rows; expert 3 has 4
    pairs = sorted_ids[:rows]
    assert sorted(pairs[pairs < num_pairs].tolist()) == list(range(num_pairs))
    flat = ids.flatten()
    for block in range(rows // 2):
        members = [p for p in sorted_ids[2 * block: 2 * block + 2].tolist() if p < num_pairs]
        assert members and all(flat[p] == block_expert[block] for p in members)


@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weighted"])
def test_sum_pairs(weighted: bool) -> None:
    g = torch.Generator().manual_seed(4)
    partial = torch.randn(5 * 3, 40, generator=g).to(DEVICE)
    weights = torch.rand(5, 3, generator=g).to(DEVICE)
    expected = (partial.view(5, 3, 40) * (weights.unsqueeze(-1) if weighted else 1)).sum(1)
    torch.testing.assert_close(sum_pairs(partial, 3, weights if weighted else None), expected)


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
def test_mixtral_shapes_bf16_cuda() -> None:
    case = make_case(300, 8, 2, hidden=4096, inter=1792, dtype=torch.bfloat16, device="cuda")
    x, w13, w2, weights, ids = case
    expected = fused_experts_ref(x.float(), w13.float(), w2.float(), weights, ids)
    torch.testing.assert_close(fused_experts(*case).float(), expected, atol=3e-2, rtol=3e-2)
