"""Top-k routing against the routers of HF transformers (the oracle): softmax with and without
renormalisation, DeepSeek V2's group-limited greedy, DeepSeek V3's sigmoid grouped top-k with its
correction bias, renormalisation and routed scaling factor."""

from __future__ import annotations

import pytest
import torch
from transformers import DeepseekV2Config, DeepseekV3Config, MixtralConfig, Qwen2MoeConfig
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeTopKRouter

from wick.layers.moe.routing import select_experts
from wick.models.config import ModelConfig

HIDDEN, TOKENS = 32, 50


def _by_expert(weights: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    order = ids.argsort(dim=-1)
    return weights.gather(1, order), ids.gather(1, order)


def _compare(router: torch.nn.Module, config, correction_bias: torch.Tensor | None = None) -> None:
    torch.manual_seed(0)
    with torch.no_grad():
        router.weight.normal_()
        x = torch.randn(TOKENS, HIDDEN)
        _, hf_weights, hf_ids = router(x)
    spec = ModelConfig.from_hf(config).moe
    weights, ids = select_experts(x @ router.weight.T, spec.top_k, spec.renormalize, spec.scoring,
                                  spec.num_expert_group, spec.topk_group, spec.group_score, correction_bias,
                                  spec.routed_scaling_factor)
    hf_weights, hf_ids = _by_expert(hf_weights.float(), hf_ids)
    weights, ids = _by_expert(weights, ids)
    assert torch.equal(ids, hf_ids)
    torch.testing.assert_close(weights, hf_weights, atol=1e-6, rtol=1e-5)


_SMALL = dict(hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=4, vocab_size=64)


def test_mixtral_softmax_renormalised() -> None:
    config = MixtralConfig(**_SMALL, num_local_experts=8, num_experts_per_tok=2)
    _compare(MixtralTopKRouter(config), config)


@pytest.mark.parametrize("norm", [False, True])
def test_qwen2_moe_softmax(norm: bool) -> None:
    config = Qwen2MoeConfig(**_SMALL, num_experts=10, num_experts_per_tok=4, norm_topk_prob=norm)
    _compare(Qwen2MoeTopKRouter(config), config)


@pytest.mark.parametrize("method", ["greedy", "group_limited_greedy"])
def test_deepseek_v2_grouped_softmax_scaled(method: str) -> None:
    config = DeepseekV2Config(**_SMALL, n_routed_experts=16, num_experts_per_tok=3, n_group=4, topk_group=2,
                              topk_method=method, routed_scaling_factor=1.5)
    _compare(DeepseekV2TopkRouter(config), config)


@pytest.mark.parametrize("norm", [False, True])
def test_deepseek_v3_sigmoid_grouped_with_bias(norm: bool) -> None:
    config = DeepseekV3Config(**_SMALL, n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2,
                              norm_topk_prob=norm, routed_scaling_factor=2.5)
    router = DeepseekV3TopkRouter(config)
    bias = torch.rand(16) * 0.5
    router.e_score_correction_bias.copy_(bias)
    _compare(router, config, correction_bias=bias)
