"""The MoE layer's experts quantized in situ (`-q q4_k`, `q5_k`, `q2_k`, ...): a float checkpoint's experts packed
as they load, a model so quantized against the HF forward over the same weights rounded by the gguf package, and the
shapes whose experts stay floats."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from transformers import AutoConfig, AutoModelForCausalLM

from wick.layers.moe.fused_moe import FusedMoE, _warn_once
from wick.layers.quantization.base import quantization_scope
from wick.layers.quantization.gguf_quantize import quantize
from wick.layers.quantization.isq import InSituGGUFConfig
from wick.loader.weights import process_weights_after_loading
from wick.models.config import MoeSpec
from wick.models.registry import get_model_class

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models"))
from paged_generate import PagedRunner, Sequence  # noqa: E402

T = GGMLQuantizationType
SIZES = dict(vocab_size=96, hidden_size=256, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=64, max_position_embeddings=512, num_experts=4, num_experts_per_tok=2,
             moe_intermediate_size=256, norm_topk_prob=True, tie_word_embeddings=False)
# The projections our in-situ quantization rounds: attention's and the experts'; routers, norms, embeddings and
# the LM head stay floats.
ROUNDED = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "experts.gate_up_proj",
           "experts.down_proj")


def _rounded_by_gguf(weight: torch.Tensor, qtype: GGMLQuantizationType) -> torch.Tensor:
    """`weight` quantized by our quantizer, decoded by the gguf package, row by row of its last dimension."""
    rows = weight.reshape(-1, weight.shape[-1])
    decoded = gguf.quants.dequantize(quantize(rows, qtype).numpy(), qtype)
    return torch.from_numpy(np.ascontiguousarray(decoded)).reshape(weight.shape)


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_0, T.Q5_1],
                         ids=lambda t: t.name)
def test_model_with_experts_quantized_at_load_matches_reference(monkeypatch: pytest.MonkeyPatch,
                                                                qtype: GGMLQuantizationType) -> None:
    monkeypatch.setenv("WICK_CPU_QUANT_KERNELS", "0")  # attention's GGUF layers in float32, not the bf16 kernels
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen3_moe", **SIZES), dtype=torch.float32).eval()
    with quantization_scope(InSituGGUFConfig(qtype.name.lower())):
        ours = get_model_class([type(hf).__name__])(hf.config).eval()
    with torch.no_grad():
        ours.load_weights(hf.state_dict().items())
    process_weights_after_loading(ours)
    layers = [m for m in ours.modules() if isinstance(m, FusedMoE)]
    assert layers and all(m.w13_weight.dtype == torch.uint8 and {p.qtype for p in m.packed.values()} == {qtype}
                          for m in layers)
    reference = type(hf)(hf.config).eval()
    reference.load_state_dict({name: _rounded_by_gguf(t, qtype) if name.endswith(ROUNDED) else t
                               for name, t in hf.state_dict().items()})
    prompt = [5, 17, 3, 60, 2, 41, 9, 9, 30]
    (logits,) = PagedRunner(ours).step([(Sequence(prompt), len(prompt))])
    with torch.no_grad():
        expected = reference(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)


def _layer(quantization: str, spec: MoeSpec, hidden: int) -> FusedMoE:
    with quantization_scope(InSituGGUFConfig(quantization)):
        return FusedMoE(spec, hidden)


def test_experts_by_one_or_all_at_once_pack_the_same() -> None:
    """A checkpoint's experts one matrix at a time (gate, up, down of expert e) or stacked ([E, 2I, H], [E, H, I])
    give the same blocks: each row is quantized on its own."""
    spec = MoeSpec(num_experts=3, top_k=2, intermediate_size=256, renormalize=True)
    generator = torch.Generator().manual_seed(0)
    gate_up = torch.randn(3, 512, 512, generator=generator)
    down = torch.randn(3, 512, 256, generator=generator)
    stacked, single = _layer("q4_k", spec, 512), _layer("q4_k", spec, 512)
    stacked.w13_weight.weight_loader(stacked.w13_weight, gate_up, ("gate_up", None))
    stacked.w2_weight.weight_loader(stacked.w2_weight, down, ("down", None))
    for e in range(3):
        single.w13_weight.weight_loader(single.w13_weight, gate_up[e, :256], ("gate", e))
        single.w13_weight.weight_loader(single.w13_weight, gate_up[e, 256:], ("up", e))
        single.w2_weight.weight_loader(single.w2_weight, down[e], ("down", e))
    assert torch.equal(stacked.w13_weight, single.w13_weight) and torch.equal(stacked.w2_weight, single.w2_weight)
    assert torch.equal(stacked.w13_weight[1], quantize(gate_up[1], T.Q4_K))
    assert torch.equal(single.w2_weight[2], quantize(down[2], T.Q4_K))


@pytest.mark.parametrize("quantization", ["q8_0", "q4_0"])
def test_experts_off_whole_groups_stay_floats(caplog: pytest.LogCaptureFixture, quantization: str) -> None:
    intermediate = 96
    spec = MoeSpec(num_experts=2, top_k=1, intermediate_size=intermediate, renormalize=True)
    _warn_once.cache_clear()  # the warning is given once a process
    with caplog.at_level(logging.WARNING, logger="wick.layers.moe.fused_moe"):
        layer = _layer(quantization, spec, 512)
    assert layer.isq_type is None and not layer.packed
    assert layer.w13_weight.dtype == torch.float32 and layer.w13_weight.shape == (2, 2 * intermediate, 512)
    message = "packed experts need rows of whole 256-value groups, and their rows are 512 and 96"
    assert any(message in record.getMessage() for record in caplog.records)
