"""GPTQ and AWQ checkpoints written by our own quantizer in the published layouts: wick's forward
against the HF forward over the weights they dequantize to; bad quantization_configs refused."""

from __future__ import annotations

import pytest
import torch
from int_checkpoints import awq_tensors, gptq_tensors
from quantized_pair import assert_same_logits, build_ours, is_projection, reference_with, small_llama
from transformers import LlamaConfig

from wick.layers.quantization import resolve_quantization
from wick.layers.quantization.awq import AWQConfig
from wick.layers.quantization.gptq import GPTQConfig

# Projections that read the same input share GPTQ's act-order permutation (one Hessian).
_INPUT_OF = {"q_proj": "attn", "k_proj": "attn", "v_proj": "attn", "o_proj": "o", "gate_proj": "mlp",
             "up_proj": "mlp", "down_proj": "down"}


def _quantized_checkpoint(hf: torch.nn.Module, quantize) -> tuple[list, dict[str, torch.Tensor]]:
    checkpoint, dequantized = [], {}
    for name, tensor in hf.state_dict().items():
        if not is_projection(name):
            checkpoint.append((name, tensor))
            continue
        prefix = name.removesuffix(".weight")
        tensors, dequantized[name] = quantize(prefix, tensor)
        checkpoint += [(f"{prefix}.{key}", value) for key, value in tensors.items()]
    return checkpoint, dequantized


@pytest.mark.parametrize(("bits", "group", "desc_act", "sym"), [
    (4, 128, False, True), (4, 64, True, False), (8, 128, True, True), (4, -1, False, False), (8, -1, False, True),
])
def test_gptq_matches_reference(bits: int, group: int, desc_act: bool, sym: bool) -> None:
    hf = small_llama()

    def quantize(prefix: str, w: torch.Tensor):
        layer, projection = prefix.split(".")[2], prefix.split(".")[-1]
        seed = hash((layer, _INPUT_OF[projection])) % 1000
        perm = torch.randperm(w.shape[1], generator=torch.Generator().manual_seed(seed))
        return gptq_tensors(w, bits, group, desc_act, sym, perm)

    checkpoint, dequantized = _quantized_checkpoint(hf, quantize)
    config = GPTQConfig.from_config({"quant_method": "gptq", "bits": bits, "group_size": group,
                                     "desc_act": desc_act, "sym": sym})
    ours = build_ours(hf.config, config, checkpoint)
    assert ours.model.layers[0].mlp.down_proj.qweight.dtype == torch.int32
    assert_same_logits(ours, reference_with(hf, lambda name, _: dequantized[name]))


@pytest.mark.parametrize("group", [64, 128])
def test_awq_matches_reference(group: int) -> None:
    hf = small_llama()
    checkpoint, dequantized = _quantized_checkpoint(hf, lambda _, w: awq_tensors(w, group))
    config = AWQConfig.from_config({"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
                                    "version": "gemm"})
    ours = build_ours(hf.config, config, checkpoint)
    assert_same_logits(ours, reference_with(hf, lambda name, _: dequantized[name]))


def _config_with(quantization_config: dict) -> LlamaConfig:
    return LlamaConfig(quantization_config=quantization_config)


def test_checkpoint_configs_are_recognised() -> None:
    gptq = resolve_quantization(None, "safetensors", _config_with({"quant_method": "gptq", "bits": 4,
                                                                    "group_size": 128, "desc_act": True}))
    assert isinstance(gptq, GPTQConfig) and gptq.desc_act and gptq.describe() == "GPTQ 4-bit g128 act-order"
    awq = resolve_quantization("awq", "safetensors", _config_with({"quant_method": "awq", "bits": 4,
                                                                   "group_size": 128, "version": "GEMM"}))
    assert isinstance(awq, AWQConfig)


@pytest.mark.parametrize(("requested", "stored", "message"), [
    (None, {"quant_method": "gptq", "bits": 3, "group_size": 128}, "bits must be 4 or 8"),
    (None, {"quant_method": "gptq", "bits": 4, "group_size": 0}, "group_size must be positive or -1"),
    (None, {"quant_method": "awq", "bits": 4, "version": "gemv"}, "version 'gemv' is not supported"),
    (None, {"quant_method": "bitsandbytes"}, "quant_method 'bitsandbytes' is not supported"),
    ("awq", {"quant_method": "gptq", "bits": 4}, "quantized with gptq; it cannot be loaded as awq"),
    ("q4k", {"quant_method": "gptq", "bits": 4}, "quantized with gptq; it cannot be loaded as q4_k"),
])
def test_bad_quantization_config_is_one_line(requested: str | None, stored: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message) as error:
        resolve_quantization(requested, "safetensors", _config_with(stored))
    assert "\n" not in str(error.value)


def test_gptq_without_checkpoint_config_is_refused() -> None:
    with pytest.raises(ValueError, match="needs a checkpoint"):
        resolve_quantization("gptq", "safetensors", LlamaConfig())


def test_gptq_without_g_idx_loads() -> None:
    hf = small_llama()
    checkpoint, dequantized = _quantized_checkpoint(hf, lambda _, w: gptq_tensors(w, 4, 128, False, True, None))
    checkpoint = [(name, t) for name, t in checkpoint if not name.endswith("g_idx")]
    config = GPTQConfig.from_config({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False})
    model = build_ours(hf.config, config, checkpoint)
    assert_same_logits(model, reference_with(hf, lambda name, _: dequantized[name]))
