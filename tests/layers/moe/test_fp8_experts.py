"""MoE experts in fp8: FP8 checkpoints of a small Qwen3-MoE written by our quantizer in the published layouts
(each expert's matrices in e4m3 with `weight_scale_inv` over 128 x 128 blocks, or one `weight_scale` each with
static `input_scale`s) and in-situ `-q fp8`, each against the HF forward over the weights they dequantize to;
refusals in one line; random fp8 experts for `--load-format dummy`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from moe_checkpoints import (
    ATTENTION,
    TP_PROMPT,
    assert_dummy_experts_run_as_dequantized,
    assert_same_logits,
    build_ours,
    first_logits,
    hf_model,
    logits_on_two_ranks,
    per_expert,
    reference,
)

from wick.kernels.fp8_matmul import fp8_dequantize
from wick.layers.moe.fused_moe import FusedMoE
from wick.layers.quantization import resolve_quantization
from wick.layers.quantization.base import quantization_scope
from wick.layers.quantization.fp8 import FP8_MAX, Fp8Config, quantize_rows
from wick.loader.dummy import initialize_dummy_weights
from wick.models.config import MoeSpec

BLOCK_CONFIG = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


def _block_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (e4m3, scale [ceil(N / 128), ceil(K / 128)]) with each tile's largest value at FP8_MAX."""
    n, k = w.shape
    padded = torch.zeros(-(-n // 128) * 128, -(-k // 128) * 128)
    padded[:n, :k] = w
    tiles = padded.reshape(padded.shape[0] // 128, 128, padded.shape[1] // 128, 128)
    scale = tiles.abs().amax(dim=(1, 3)) / FP8_MAX
    expanded = scale.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    return (w / expanded).to(torch.float8_e4m3fn), scale


def _tensor_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = w.abs().max() / FP8_MAX
    return (w / scale).to(torch.float8_e4m3fn), scale


def _checkpoint(hf: torch.nn.Module, quantize: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
                scale_name: str, input_scales: bool = False) -> tuple[list, dict[str, torch.Tensor]]:
    """An FP8 checkpoint of `hf` (its attention and experts quantized, one matrix at a time) and the weights it
    dequantizes to, stacked back as transformers 5 holds them."""
    checkpoint, dequantized = [], {}
    for name, tensor in per_expert(hf.state_dict()):
        if name.endswith(ATTENTION) or ".experts." in name:
            weight, scale = quantize(tensor)
            checkpoint += [(name, weight), (name.replace("weight", scale_name), scale)]
            if input_scales:
                checkpoint.append((name.replace("weight", "input_scale"), torch.tensor(1.0)))
            dequantized[name] = fp8_dequantize(weight, scale.reshape(1, 1) if scale.dim() == 0 else scale,
                                               (128, 128) if scale.dim() else tensor.shape)
        else:
            checkpoint.append((name, tensor))
    return checkpoint, dequantized


def _experts(model: torch.nn.Module) -> list[FusedMoE]:
    layers = [m for m in model.modules() if isinstance(m, FusedMoE)]
    assert layers and all(m.fp8 is not None and m.w13_weight.dtype == torch.float8_e4m3fn for m in layers)
    return layers


def test_block_scaled_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WICK_CPU_QUANT_KERNELS", "0")
    hf = hf_model()
    checkpoint, dequantized = _checkpoint(hf, _block_quantize, "weight_scale_inv")
    ours = build_ours(hf.config, Fp8Config.from_config(BLOCK_CONFIG), checkpoint)
    assert {m.fp8.experts["w13"].block for m in _experts(ours)} == {(128, 128)}
    assert_same_logits(ours, reference(hf, dequantized))


@pytest.mark.slow
def test_block_scaled_checkpoint_on_two_ranks(tmp_path: Path) -> None:
    """Each of two gloo ranks holds half of every expert's intermediate rows (one 128-row scale tile of 256). Hidden
    384: a dense layer's unsplit output dimension is whole scale tiles under tensor parallelism."""
    hf = hf_model(hidden_size=384)
    checkpoint, _ = _checkpoint(hf, _block_quantize, "weight_scale_inv")
    config = Fp8Config.from_config(BLOCK_CONFIG)
    expected = first_logits(build_ours(hf.config, config, checkpoint), TP_PROMPT)
    torch.testing.assert_close(logits_on_two_ranks(hf.config, config, checkpoint, tmp_path), expected, atol=1e-4,
                               rtol=1e-4)


def test_per_tensor_checkpoint_with_static_input_scales(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WICK_CPU_QUANT_KERNELS", "0")
    hf = hf_model()
    checkpoint, dequantized = _checkpoint(hf, _tensor_quantize, "weight_scale", input_scales=True)
    config = Fp8Config.from_config({"quant_method": "fp8", "activation_scheme": "static"})
    ours = build_ours(hf.config, config, checkpoint)
    layer = _experts(ours)[0]
    assert layer.w13_weight_scale.shape == (4, 2, 1) and layer.fp8.experts["w13"].block == (256, 320)
    assert_same_logits(ours, reference(hf, dequantized))


def test_in_situ(monkeypatch: pytest.MonkeyPatch) -> None:
    """`-q fp8` on a float checkpoint (transformers 5's stacked experts): one scale a row of every expert."""
    monkeypatch.setenv("WICK_CPU_QUANT_KERNELS", "0")
    hf = hf_model()
    config = resolve_quantization("fp8", "safetensors", hf.config)
    ours = build_ours(hf.config, config, hf.state_dict().items())
    assert _experts(ours)[0].w13_weight_scale.shape == (4, 512, 1)

    def rounded(w: torch.Tensor) -> torch.Tensor:
        weight, scale = quantize_rows(w)
        return weight.float() * scale

    dequantized = {name: rounded(t) for name, t in per_expert(hf.state_dict())
                   if name.endswith(ATTENTION) or ".experts." in name}
    assert_same_logits(ours, reference(hf, dequantized))


def test_block_scales_off_the_intermediate_size_are_refused() -> None:
    spec = MoeSpec(num_experts=2, top_k=1, intermediate_size=192, renormalize=True)
    with quantization_scope(Fp8Config.from_config(BLOCK_CONFIG)), pytest.raises(
            ValueError, match=r"FP8 experts in 128x128 blocks need the expert intermediate size on each rank \(192\)"):
        FusedMoE(spec, 256)


def test_scale_blocks_narrower_than_a_tile_step_are_refused() -> None:
    spec = MoeSpec(num_experts=2, top_k=1, intermediate_size=128, renormalize=True)
    config = Fp8Config.from_config({**BLOCK_CONFIG, "weight_block_size": [128, 24]})
    with quantization_scope(config), pytest.raises(ValueError, match="the block's width must be a multiple of 16"):
        FusedMoE(spec, 256)


def test_experts_converted_where_the_gpu_has_no_fp8(monkeypatch: pytest.MonkeyPatch) -> None:
    """Below compute capability 8.9 the experts become the model's dtype at load, and their scales go."""
    spec = MoeSpec(num_experts=2, top_k=1, intermediate_size=128, renormalize=True)
    with quantization_scope(Fp8Config.from_config(BLOCK_CONFIG)):
        layer = FusedMoE(spec, 256)
    initialize_dummy_weights(layer)
    expected = layer.fp8.experts["w13"].dequantize_all()
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    layer.process_weights_after_loading()
    monkeypatch.undo()
    assert layer.fp8 is None and layer.w13_weight.dtype == torch.float32
    assert not hasattr(layer, "w13_weight_scale_inv") and not hasattr(layer, "w2_weight_scale_inv")
    torch.testing.assert_close(layer.w13_weight.data, expected)


def test_float_expert_in_an_fp8_checkpoint_is_refused() -> None:
    spec = MoeSpec(num_experts=2, top_k=1, intermediate_size=128, renormalize=True)
    with quantization_scope(Fp8Config.from_config(BLOCK_CONFIG)):
        layer = FusedMoE(spec, 256)
    with pytest.raises(ValueError, match="an FP8 checkpoint's expert weight \\(gate\\) is torch.float32"):
        layer.w13_weight.weight_loader(layer.w13_weight, torch.zeros(128, 256), ("gate", 0))


@pytest.mark.parametrize("config", [Fp8Config((128, 128)), Fp8Config(in_situ=True)], ids=["block", "in_situ"])
def test_dummy_experts(config: Fp8Config) -> None:
    """Random fp8 experts: every expert filled, and the layer runs on them as the reference over their values."""
    spec = MoeSpec(num_experts=3, top_k=2, intermediate_size=128, renormalize=True)
    with quantization_scope(config):
        layer = FusedMoE(spec, 256)
    initialize_dummy_weights(layer)
    assert_dummy_experts_run_as_dequantized(layer, layer.fp8.experts)
