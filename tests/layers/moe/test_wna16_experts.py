"""MoE experts of GPTQ and AWQ checkpoints: a small Qwen3-MoE quantized by our round-to-nearest quantizer into the
published layouts (every expert's gate, up and down projections and the attention as GPTQ or AWQ layers), against
the HF forward over the weights they dequantize to, on one rank and on two; act-order and ill-fitting groups refused
in one line; a GPTQ checkpoint folder served by the engine (CPU, and the kernels on a GPU) with HF's greedy tokens;
random packed experts for `--load-format dummy`."""

from __future__ import annotations

import copy
import sys
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

from wick.layers.moe.fused_moe import FusedMoE
from wick.layers.quantization.awq import AWQConfig
from wick.layers.quantization.base import QuantizationConfig, quantization_scope
from wick.layers.quantization.gptq import GPTQConfig
from wick.loader.dummy import initialize_dummy_weights
from wick.models.config import MoeSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "quantization"))
from hf_configs import word_tokenizer  # noqa: E402 (tests/models, on the path from moe_checkpoints)
from int_checkpoints import awq_tensors, gptq_tensors  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from wick import LLM, SamplingParams  # noqa: E402

Quantize = Callable[[torch.Tensor], tuple[dict[str, torch.Tensor], torch.Tensor]]


def _checkpoint(hf: torch.nn.Module, quantize: Quantize) -> tuple[list, dict[str, torch.Tensor]]:
    """A checkpoint of `hf` with its attention and every expert's projections quantized (tensors named as GPTQ and
    AWQ checkpoints on the hub name them) and the weights those dequantize to."""
    checkpoint, dequantized = [], {}
    for name, tensor in per_expert(hf.state_dict()):
        if name.endswith(ATTENTION) or ".experts." in name:
            tensors, dequantized[name] = quantize(tensor)
            checkpoint += [(name.replace("weight", key), value) for key, value in tensors.items()]
        else:
            checkpoint.append((name, tensor))
    return checkpoint, dequantized


def _gptq(bits: int, group: int, sym: bool, desc_act: bool = False) -> tuple[GPTQConfig, Quantize]:
    config = GPTQConfig.from_config({"quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": desc_act,
                                     "sym": sym})
    return config, lambda w: gptq_tensors(w, bits, group, desc_act, sym, torch.randperm(w.shape[1]))


def _awq(group: int) -> tuple[AWQConfig, Quantize]:
    config = AWQConfig.from_config({"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
                                    "version": "gemm"})
    return config, lambda w: awq_tensors(w, group)


def _experts(model: torch.nn.Module) -> list[FusedMoE]:
    layers = [m for m in model.modules() if isinstance(m, FusedMoE)]
    assert layers and all(m.wna16 is not None and m.w13_qweight.dtype == torch.int32 for m in layers)
    return layers


FORMATS = {"gptq4_g128_sym": lambda: _gptq(4, 128, True), "gptq8_g64_asym": lambda: _gptq(8, 64, False),
           "gptq4_channel": lambda: _gptq(4, -1, False), "awq_g64": lambda: _awq(64)}


@pytest.mark.parametrize("make", FORMATS.values(), ids=FORMATS.keys())
def test_checkpoint_matches_reference(make: Callable[[], tuple[QuantizationConfig, Quantize]]) -> None:
    """Hidden 320 in groups of 128 (gptq4_g128_sym): the last group of every w13 column is partial."""
    hf = hf_model()
    config, quantize = make()
    checkpoint, dequantized = _checkpoint(hf, quantize)
    ours = build_ours(hf.config, config, checkpoint)
    layer = _experts(ours)[0]
    assert layer.wna16.experts["w13"].shape == (4, 512, 320) and layer.wna16.experts["w2"].shape == (4, 320, 256)
    assert_same_logits(ours, reference(hf, dequantized))


def test_checkpoint_without_g_idx_loads() -> None:
    """GPTQ checkpoints without desc_act may leave g_idx out: their groups run in row order."""
    hf = hf_model()
    config, quantize = _gptq(4, 128, True)
    checkpoint, dequantized = _checkpoint(hf, quantize)
    checkpoint = [(name, tensor) for name, tensor in checkpoint if not name.endswith("g_idx")]
    assert_same_logits(build_ours(hf.config, config, checkpoint), reference(hf, dequantized))


def test_desc_act_with_groups_in_row_order_loads() -> None:
    """desc_act set, but each expert's g_idx happens to run in row order: nothing needs permuting."""
    hf = hf_model()
    config, _ = _gptq(4, 128, True, desc_act=True)
    checkpoint, dequantized = _checkpoint(hf, lambda w: gptq_tensors(w, 4, 128, True, True, torch.arange(w.shape[1])))
    assert_same_logits(build_ours(hf.config, config, checkpoint), reference(hf, dequantized))


def test_act_order_experts_are_refused() -> None:
    hf = hf_model()
    config, quantize = _gptq(4, 128, True, desc_act=True)
    checkpoint, _ = _checkpoint(hf, quantize)
    with pytest.raises(ValueError, match=r"GPTQ experts with act-order groups \(desc_act, g_idx out of row order\)"):
        build_ours(hf.config, config, checkpoint)


@pytest.mark.slow
@pytest.mark.parametrize("make", [FORMATS["gptq4_g128_sym"], FORMATS["awq_g64"]], ids=["gptq", "awq"])
def test_checkpoint_on_two_ranks(make: Callable[[], tuple[QuantizationConfig, Quantize]], tmp_path: Path) -> None:
    """Each of two gloo ranks holds half of every expert's intermediate size: gate and up columns (AWQ's packed
    eight to a word), down rows with their groups."""
    hf = hf_model(hidden_size=384)
    config, quantize = make()
    checkpoint, _ = _checkpoint(hf, quantize)
    expected = first_logits(build_ours(hf.config, config, checkpoint), TP_PROMPT)
    torch.testing.assert_close(logits_on_two_ranks(hf.config, config, checkpoint, tmp_path), expected, atol=1e-4,
                               rtol=1e-4)


def test_groups_that_do_not_fit_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = MoeSpec(num_experts=2, top_k=1, intermediate_size=192, renormalize=True)
    with quantization_scope(_gptq(4, 40, True)[0]), pytest.raises(
            ValueError, match="GPTQ experts in groups of 40 are not supported: the group size must be a multiple"):
        FusedMoE(spec, 256)
    monkeypatch.setattr("wick.layers.moe.fused_moe.tp_world_size", lambda: 2)
    with quantization_scope(_awq(128)[0]), pytest.raises(
            ValueError, match=r"expert intermediate size on each rank \(96\) to be multiples of 8 and the latter of "
                              r"the group size 128"):
        FusedMoE(spec, 256)


@pytest.mark.parametrize("config", [_gptq(4, 128, True)[0], _gptq(8, -1, False)[0], _awq(128)[0]],
                         ids=["gptq4", "gptq8_channel", "awq"])
def test_dummy_experts(config: QuantizationConfig) -> None:
    """Random packed experts: weights within [-1e-3, 1e-3], not all zero, and the layer runs on them as the
    reference over their values."""
    spec = MoeSpec(num_experts=3, top_k=2, intermediate_size=128, renormalize=True)
    with quantization_scope(config):
        layer = FusedMoE(spec, 256)
    initialize_dummy_weights(layer)
    layer.process_weights_after_loading()
    assert_dummy_experts_run_as_dequantized(layer, layer.wna16.experts)


def _gptq_folder(tmp_path: Path, bits: int) -> tuple[str, list[list[int]], list[list[int]]]:
    """A GPTQ checkpoint folder (config.json with its quantization_config, model.safetensors, a tokenizer), prompts,
    and HF's greedy tokens over the weights it dequantizes to."""
    hf = hf_model()
    _, quantize = _gptq(bits, 128, True)
    checkpoint, dequantized = _checkpoint(hf, quantize)
    config = copy.deepcopy(hf.config)
    config.architectures = [type(hf).__name__]
    config.quantization_config = {"quant_method": "gptq", "bits": bits, "group_size": 128, "desc_act": False,
                                  "sym": True}
    config.save_pretrained(tmp_path)
    save_file({name: tensor.contiguous() for name, tensor in checkpoint}, tmp_path / "model.safetensors")
    word_tokenizer(config.vocab_size).save_pretrained(tmp_path)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, config.vocab_size, (n,), generator=g).tolist() for n in (5, 19, 30, 11)]
    reference_model = reference(hf, dequantized)
    with torch.no_grad():
        expected = [reference_model.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False)[0, len(p):].tolist()
                    for p in prompts]
    return str(tmp_path), prompts, expected


@pytest.mark.slow
def test_gptq_folder_through_the_engine(tmp_path: Path) -> None:
    """config.json's quantization_config read, the experts loaded packed, HF's greedy tokens with chunked prefill
    and preemption (14 blocks of 4 tokens cannot hold the four requests)."""
    folder, prompts, expected = _gptq_folder(tmp_path, 4)
    llm = LLM(folder, device="cpu", block_size=4, num_kv_blocks=14, max_num_batched_tokens=8, max_num_seqs=4)
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert llm.core.scheduler.num_preemptions > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gptq_folder_through_the_engine_on_cuda(tmp_path: Path) -> None:
    """The same in fp32 on a GPU: the expert GEMVs and the dense W8A16 GEMVs in CUDA graphs (8 bits: the activations
    stay float, as the reference's)."""
    folder, prompts, expected = _gptq_folder(tmp_path, 8)
    llm = LLM(folder, device="cuda", dtype="float32", attention_backend="triton", block_size=16, max_num_seqs=4,
              kv_cache_memory=256 * 2**20)
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in outputs] == expected
