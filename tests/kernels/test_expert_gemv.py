"""The expert GEMVs against the torch MoE reference: one and several tokens, top-k of 1 to 6, K and rows past the
last whole step and tile, float32 and half precision; and where the float experts' layer picks them."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.test_fused_moe import make_case
from wick.kernels import expert_gemv
from wick.kernels.expert_gemv import gemv_experts
from wick.layers.moe import fused_moe
from wick.layers.moe.fused_moe import fused_experts_float, fused_experts_ref

TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 3e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(("tokens", "experts", "top_k", "hidden", "inter"),
                         [(1, 8, 2, 64, 32), (3, 16, 6, 96, 40), (2, 4, 1, 100, 24), (1, 6, 3, 32, 128)])
def test_matches_reference(tokens: int, experts: int, top_k: int, hidden: int, inter: int,
                           dtype: torch.dtype) -> None:
    """Small steps and tiles (several steps along K, a last step and a last tile cut short) and the defaults."""
    case = make_case(tokens, experts, top_k, hidden, inter, dtype)
    expected = fused_experts_ref(*case).float()
    scale = TOLERANCE[dtype] * expected.abs().max().item()
    for configs in ((2, 32, 1), (4, 16, 2)), (None, None):
        out = gemv_experts(*case, *configs)
        assert out.dtype == dtype and out.shape == case[0].shape
        torch.testing.assert_close(out.float(), expected, atol=scale, rtol=0)


def test_tokens_sharing_experts() -> None:
    """Several tokens routed to the same experts (each pair reads its expert's rows itself)."""
    case = make_case(5, 4, 2, 64, 48, torch.float32, used_experts=2)
    torch.testing.assert_close(gemv_experts(*case, (2, 32, 1), (2, 16, 1)), fused_experts_ref(*case), atol=1e-4,
                               rtol=1e-4)


def test_layer_picks_gemvs_up_to_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """fused_experts_float: the GEMVs up to GEMV_MAX_PAIRS pairs (and GEMV_PAIRS_PER_EXPERT an expert), the tiles
    past them; both paths give the reference's outputs."""
    ran = []
    real = expert_gemv.gemv_experts

    def recording(*args, **kwargs) -> torch.Tensor:
        ran.append(args[4].numel())
        return real(*args, **kwargs)

    monkeypatch.setattr(expert_gemv, "gemv_experts", recording)
    monkeypatch.setattr(fused_moe, "GEMV_MAX_PAIRS", 8)
    for tokens in (4, 5):  # 8 and 10 pairs of top-2 over 16 experts
        case = make_case(tokens, 16, 2, 32, 48, torch.float32)
        torch.testing.assert_close(fused_experts_float(*case), fused_experts_ref(*case), atol=1e-4, rtol=1e-4)
    assert ran == [8]
    case = make_case(3, 2, 2, 32, 48, torch.float32)  # 6 pairs over 2 experts: more than 2 an expert
    torch.testing.assert_close(fused_experts_float(*case), fused_experts_ref(*case), atol=1e-4, rtol=1e-4)
    assert ran == [8]
