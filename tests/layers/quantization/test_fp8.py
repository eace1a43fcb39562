"""FP8 weights: block-scaled and per-tensor checkpoints written by our quantizer, and in-situ fp8, against
the HF forward over the dequantized weights; bad FP8 configs refused in one line."""

from __future__ import annotations

import pytest
import torch
from quantized_pair import assert_same_logits, build_ours, is_projection, reference_with, small_llama
from transformers import LlamaConfig

from wick.kernels.fp8_matmul import fp8_dequantize
from wick.layers.activation import SiluAndMul
from wick.layers.linear import MergedColumnParallelLinear
from wick.layers.quantization import resolve_quantization
from wick.layers.quantization.base import quantization_scope
from wick.layers.quantization.fp8 import FP8_MAX, Fp8Config, quantize_rows


def _block_quantize(w: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    n, k = w.shape
    tiles = w.reshape(n // block, block, k // block, block)
    scale = tiles.abs().amax(dim=(1, 3)) / FP8_MAX
    expanded = scale.repeat_interleave(block, 0).repeat_interleave(block, 1)
    return (w / expanded).to(torch.float8_e4m3fn), scale


def test_block_scaled_checkpoint() -> None:
    hf = small_llama()
    checkpoint, dequantized = [], {}
    for name, tensor in hf.state_dict().items():
        if is_projection(name):
            weight, scale = _block_quantize(tensor, 128)
            checkpoint += [(name, weight), (name.replace("weight", "weight_scale_inv"), scale)]
            dequantized[name] = fp8_dequantize(weight, scale, (128, 128))
        else:
            checkpoint.append((name, tensor))
    config = Fp8Config.from_config({"quant_method": "fp8", "activation_scheme": "dynamic",
                                    "weight_block_size": [128, 128]})
    ours = build_ours(hf.config, config, checkpoint)
    assert ours.model.layers[0].self_attn.qkv_proj.weight.dtype == torch.float8_e4m3fn
    assert_same_logits(ours, reference_with(hf, lambda name, _: dequantized[name]))


def test_per_tensor_checkpoint_with_static_input_scales() -> None:
    hf = small_llama()
    checkpoint, dequantized = [], {}
    for name, tensor in hf.state_dict().items():
        if is_projection(name):
            scale = tensor.abs().max() / FP8_MAX
            weight = (tensor / scale).to(torch.float8_e4m3fn)
            checkpoint += [(name, weight), (name.replace("weight", "weight_scale"), scale),
                           (name.replace("weight", "input_scale"), torch.tensor(1.0))]
            dequantized[name] = weight.float() * scale
        else:
            checkpoint.append((name, tensor))
    config = Fp8Config.from_config({"quant_method": "fp8", "activation_scheme": "static"})
    assert_same_logits(build_ours(hf.config, config, checkpoint),
                       reference_with(hf, lambda name, _: dequantized[name]))


def test_in_situ_fp8() -> None:
    hf = small_llama()
    config = resolve_quantization("fp8", "safetensors", hf.config)
    assert isinstance(config, Fp8Config) and config.in_situ
    ours = build_ours(hf.config, config, hf.state_dict().items())

    def dequantized(_: str, w: torch.Tensor) -> torch.Tensor:
        weight, scale = quantize_rows(w)
        return weight.float() * scale

    assert_same_logits(ours, reference_with(hf, dequantized))


@pytest.mark.parametrize(("stored", "message"), [
    ({"quant_method": "fp8", "weight_block_size": [128]}, "weight_block_size must be two positive integers"),
    ({"quant_method": "fp8", "activation_scheme": "sometimes"}, "activation_scheme must be dynamic or static"),
    ({"quant_method": "fp8", "fmt": "e5m2"}, "fmt 'e5m2' is not supported"),
])
def test_bad_fp8_config(stored: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_quantization(None, "safetensors", LlamaConfig(quantization_config=stored))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gated_gate_up_on_gpu() -> None:
    """A merged gate/up layer quantized in situ: at one bf16 row its gated GEMV gives SiLU-and-mul of its product."""
    torch.manual_seed(0)
    config = resolve_quantization("fp8", "safetensors", LlamaConfig())
    with torch.device("cuda"), quantization_scope(config):
        layer = MergedColumnParallelLinear(256, [96, 96])
    for shard in (0, 1):
        layer.weight.weight_loader(layer.weight, torch.randn(96, 256, device="cuda"), shard)
    layer.quant_method.process_weights_after_loading(layer)
    x = torch.randn(1, 256, device="cuda", dtype=torch.bfloat16)
    expected = SiluAndMul()(layer(x))
    torch.testing.assert_close(layer.gated(x, SiluAndMul()), expected, atol=0.02 * expected.abs().max().item(),
                               rtol=0)
