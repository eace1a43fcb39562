"""A GGUF file's experts held packed (wick/layers/moe/gguf_experts.py) against the same experts loaded as floats:
the CPU's reference path, and on a GPU the expert GEMVs (a few pairs) and the decoded fused kernel (many)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType

from wick.layers.moe.fused_moe import FusedMoE, fused_experts_ref
from wick.layers.moe.gguf_experts import EXPERT_GEMV_MAX_PAIRS, fused_experts_gguf
from wick.layers.moe.routing import select_experts
from wick.layers.quantization.base import quantization_scope
from wick.layers.quantization.gguf import GGUFConfig
from wick.models.config import MoeSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "quantization"))
from gguf_blocks import random_gguf  # noqa: E402

T = GGMLQuantizationType
SPEC = MoeSpec(num_experts=4, top_k=2, intermediate_size=256, renormalize=True)
HIDDEN = 512


def _pair(qtype: GGMLQuantizationType, down_type: GGMLQuantizationType, device: str) -> tuple[FusedMoE, FusedMoE]:
    """The same experts as a packed layer and as a float one."""
    with torch.device(device):
        with quantization_scope(GGUFConfig()):
            packed = FusedMoE(SPEC, HIDDEN)
        dense = FusedMoE(SPEC, HIDDEN)
    i = SPEC.intermediate_size
    for e in range(SPEC.num_experts):
        for kind, weight in (("gate", random_gguf(qtype, i, HIDDEN, seed=3 * e)),
                             ("up", random_gguf(qtype, i, HIDDEN, seed=3 * e + 1)),
                             ("down", random_gguf(down_type, HIDDEN, i, seed=3 * e + 2))):
            target = "w2_weight" if kind == "down" else "w13_weight"
            getattr(packed, target).weight_loader(getattr(packed, target), weight, (kind, e))
            getattr(dense, target).weight_loader(getattr(dense, target), weight.dequantize(torch.float32), (kind, e))
    return packed, dense


@pytest.mark.parametrize(("qtype", "down_type"), [(T.Q4_K, T.Q6_K), (T.Q8_0, T.Q8_0), (T.F16, T.F16)],
                         ids=["q4_k_q6_k", "q8_0", "f16"])
def test_packed_experts_hold_their_blocks_and_compute_as_their_floats(qtype: GGMLQuantizationType,
                                                                      down_type: GGMLQuantizationType) -> None:
    packed, dense = _pair(qtype, down_type, "cpu")
    assert packed.w13_weight.dtype == torch.uint8 and packed.w2_weight.dtype == torch.uint8
    i = SPEC.intermediate_size
    assert packed.w13_weight.numel() == SPEC.num_experts * 2 * random_gguf(qtype, i, HIDDEN).data.numel()
    x = torch.randn(5, HIDDEN, generator=torch.Generator().manual_seed(0))
    logits = torch.randn(5, SPEC.num_experts, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(packed(x, logits), dense(x, logits))


def test_experts_of_two_types_in_one_tensor_are_refused() -> None:
    with quantization_scope(GGUFConfig()):
        layer = FusedMoE(SPEC, HIDDEN)
    i = SPEC.intermediate_size
    layer.w13_weight.weight_loader(layer.w13_weight, random_gguf(T.Q4_K, i, HIDDEN), ("gate", 0))
    with pytest.raises(ValueError, match="two GGUF types"):
        layer.w13_weight.weight_loader(layer.w13_weight, random_gguf(T.Q8_0, i, HIDDEN), ("up", 0))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("down_type", "tokens", "path"), [
    (T.Q6_K, 1, None), (T.Q6_K, 3, "gemv"), (T.Q4_K, 3, "tiles"), (T.Q4_K, 70, None), (T.Q6_K, 70, None),
    (T.Q4_K, 300, None), (T.Q6_K, 300, None)])
def test_gpu_packed_experts(down_type: GGMLQuantizationType, tokens: int, path: str | None) -> None:
    packed, dense = _pair(T.Q4_K, down_type, "cuda")
    x = torch.randn(tokens, HIDDEN, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    logits = torch.randn(tokens, SPEC.num_experts, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    weights, ids = select_experts(logits, SPEC.top_k, SPEC.renormalize)
    expected = fused_experts_ref(x, dense.w13_weight, dense.w2_weight, weights, ids)
    out = fused_experts_gguf(x, packed.packed["w13"], packed.packed["w2"], weights, ids, path)
    gemv = path == "gemv" or (path is None and tokens * SPEC.top_k <= EXPERT_GEMV_MAX_PAIRS)
    # the GEMVs meet x rounded to int8 in runs of 32, as llama.cpp's experts do
    tolerance = 2e-2 if gemv else 1e-4
    torch.testing.assert_close(out, expected, atol=tolerance * expected.abs().max().item(), rtol=0)
