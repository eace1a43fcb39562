"""The one-kernel top-k routing against select_experts (the torch reference): softmax and sigmoid scoring,
renormalised or not, a correction bias that steers the choice only, a scaling factor, expert counts that
are not powers of two. The logits are float32: bfloat16 ones tie, and torch.topk leaves the order of ties
unspecified (the kernel takes the lower id first)."""

from __future__ import annotations

import pytest
import torch

from wick.kernels.topk_routing import topk_routing
from wick.layers.moe.routing import select_experts

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize(("tokens", "experts", "top_k", "scoring", "renormalize", "bias", "scaling"), [
    (1, 128, 8, "softmax", True, False, 1.0),      # Qwen3-MoE decode
    (5, 60, 4, "softmax", False, False, 1.0),      # Qwen1.5/2-MoE
    (3, 8, 2, "softmax", True, False, 1.0),        # Mixtral
    (4, 64, 6, "softmax", False, False, 2.5),      # DeepSeek-V2-Lite without groups, scaled
    (6, 48, 3, "sigmoid", True, True, 1.5),        # V3-style scoring and bias
    (2, 16, 1, "sigmoid", False, False, 1.0),
])
def test_matches_select_experts(tokens: int, experts: int, top_k: int, scoring: str, renormalize: bool,
                                bias: bool, scaling: float) -> None:
    g = torch.Generator().manual_seed(tokens * 7 + experts)
    logits = torch.randn(tokens, experts, generator=g).to(DEVICE)
    correction = torch.randn(experts, generator=g).to(DEVICE) if bias else None
    weights, ids = topk_routing(logits, top_k, renormalize, scoring, correction, scaling)
    ref_weights, ref_ids = select_experts(logits, top_k, renormalize, scoring, correction_bias=correction,
                                          routed_scaling_factor=scaling)
    assert ids.dtype == ref_ids.dtype and torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_weights, atol=1e-6, rtol=1e-5)


def test_no_tokens_and_bad_scoring() -> None:
    weights, ids = topk_routing(torch.zeros(0, 8, device=DEVICE), 2, True)
    assert weights.shape == ids.shape == (0, 2)
    with pytest.raises(ValueError, match="unknown expert scoring"):
        topk_routing(torch.zeros(1, 8, device=DEVICE), 2, True, scoring="relu")
