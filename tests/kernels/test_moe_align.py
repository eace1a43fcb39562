"""moe_align's kernels against the same layout built from a stable sort in torch: many chunks of pairs, experts
left without pairs, few and many experts, a tile size larger than some experts' runs."""

from __future__ import annotations

import pytest
import torch

from wick.kernels.moe_align import moe_align


def moe_align_ref(topk_ids: torch.Tensor, num_experts: int, block_m: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    flat = topk_ids.flatten().long()
    num_pairs = flat.numel()
    max_blocks = num_pairs // block_m + min(num_pairs, num_experts)
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    ends = padded.cumsum(0)
    order = flat.argsort(stable=True)
    rank = torch.arange(num_pairs) - (counts.cumsum(0) - counts)[flat[order]]
    sorted_ids = torch.full((max_blocks * block_m,), num_pairs, dtype=torch.int32)
    sorted_ids[(ends - padded)[flat[order]] + rank] = order.int()
    block_expert = torch.searchsorted(ends, torch.arange(max_blocks) * block_m, right=True).clamp_max(num_experts - 1)
    return sorted_ids, block_expert.int(), ends[-1:].int()


@pytest.mark.parametrize(("tokens", "top_k", "num_experts", "block_m"),
                         [(4, 2, 5, 2), (300, 8, 128, 16), (70, 2, 8, 64), (1000, 8, 256, 64), (3, 1, 3, 16),
                          (200, 8, 512, 16)])
def test_layout_matches_a_stable_sort(tokens: int, top_k: int, num_experts: int, block_m: int) -> None:
    generator = torch.Generator().manual_seed(tokens)
    # experts drawn from the first two thirds only, so some have no pairs
    ids = torch.rand(tokens, num_experts, generator=generator)[:, : max(top_k, 2 * num_experts // 3)]
    ids = ids.argsort(dim=1)[:, :top_k].int()
    for ours, reference in zip(moe_align(ids, num_experts, block_m), moe_align_ref(ids, num_experts, block_m),
                               strict=True):
        assert torch.equal(ours, reference)


def test_every_pair_lands_in_a_tile_of_its_expert() -> None:
    ids = torch.tensor([[0, 3], [3, 1], [3, 0], [2, 3]])
    sorted_ids, block_expert, num_padded = moe_align(ids, num_experts=5, block_m=2)
    assert num_padded.item() == 2 + 2 + 2 + 4  # experts 0, 1, 2 padded to 2 rows; expert 3 has 4
    assert sorted_ids[:10].tolist() == [0, 5, 3, 8, 6, 8, 1, 2, 4, 7]
    assert block_expert.tolist()[:5] == [0, 1, 2, 3, 3]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("tokens", "num_experts", "block_m"), [(2048, 128, 128), (8192, 256, 64), (37, 8, 16)])
def test_layout_matches_a_stable_sort_cuda(tokens: int, num_experts: int, block_m: int) -> None:
    logits = torch.randn(tokens, num_experts, generator=torch.Generator().manual_seed(0))
    ids = logits.topk(8 if num_experts > 8 else 2, dim=1).indices.int()
    for ours, reference in zip(moe_align(ids.cuda(), num_experts, block_m), moe_align_ref(ids, num_experts, block_m),
                               strict=True):
        assert torch.equal(ours.cpu(), reference)
