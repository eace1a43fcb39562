"""In-situ quantization: our torch GGUF quantizers against the gguf package, and a model quantized
at load against the HF forward over the same dequantized weights."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from quantized_pair import assert_same_logits, build_ours, reference_with, small_llama

from wick.config import EngineArgs
from wick.layers.quantization import normalize_quantization
from wick.layers.quantization.gguf_quantize import QUANTIZABLE_TYPES, quantize
from wick.layers.quantization.isq import InSituGGUFConfig

T = GGMLQuantizationType
# Relative error of round-to-nearest on Gaussian weights: a bound per type, well above what our fits
# reach, far below what a wrong layout gives (about 1).
_MAX_ERROR = {T.Q2_K: 0.4, T.Q3_K: 0.25, T.Q4_0: 0.1, T.Q4_1: 0.1, T.Q4_K: 0.1, T.Q5_0: 0.05, T.Q5_1: 0.05,
              T.Q5_K: 0.05, T.Q6_K: 0.025, T.Q8_0: 0.01}


def _dequantized_by_gguf(packed: torch.Tensor, qtype: GGMLQuantizationType, shape: tuple[int, int]) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(gguf.quants.dequantize(packed.numpy(), qtype))).reshape(shape)


@pytest.mark.parametrize("qtype", sorted(QUANTIZABLE_TYPES), ids=lambda t: t.name)
def test_quantizer_round_trips_through_gguf(qtype: GGMLQuantizationType) -> None:
    weight = torch.randn(16, 512, generator=torch.Generator().manual_seed(0))
    weight[3] = 0  # an all-zero row must not divide by zero
    packed = quantize(weight, qtype)
    back = _dequantized_by_gguf(packed, qtype, tuple(weight.shape))
    assert torch.equal(back[3], torch.zeros(512))
    assert ((back - weight).norm() / weight.norm()).item() < _MAX_ERROR[qtype]


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0], ids=lambda t: t.name)
def test_legacy_types_are_bit_exact_with_gguf(qtype: GGMLQuantizationType) -> None:
    weight = torch.randn(8, 256, generator=torch.Generator().manual_seed(1))
    assert np.array_equal(quantize(weight, qtype).numpy(), gguf.quants.quantize(weight.numpy(), qtype))


@pytest.mark.parametrize("name", ["q4k", "q8_0", "q6_k", "q2k"])
def test_model_quantized_at_load_matches_reference(name: str) -> None:
    hf = small_llama()
    qtype = T[normalize_quantization(name).upper()]
    ours = build_ours(hf.config, InSituGGUFConfig(normalize_quantization(name)), hf.state_dict().items())
    layer = ours.model.layers[0].self_attn.qkv_proj
    assert layer.weight.numel() == 0 and [p.qtype for p in layer.gguf_parts] == [qtype]

    def dequantized(_: str, w: torch.Tensor) -> torch.Tensor:
        return _dequantized_by_gguf(quantize(w, qtype), qtype, tuple(w.shape))

    assert_same_logits(ours, reference_with(hf, dequantized))


def test_narrow_layers_take_the_fallback_type() -> None:
    hf = small_llama(hidden=96, intermediate=320)  # neither a multiple of 256
    ours = build_ours(hf.config, InSituGGUFConfig("q4_k"), hf.state_dict().items())
    assert ours.model.layers[0].mlp.gate_up_proj.gguf_parts[0].qtype == T.Q5_0
    assert ours.model.layers[0].mlp.down_proj.gguf_parts[0].qtype == T.Q5_0

    def dequantized(_: str, w: torch.Tensor) -> torch.Tensor:
        return _dequantized_by_gguf(quantize(w, T.Q5_0), T.Q5_0, tuple(w.shape))

    assert_same_logits(ours, reference_with(hf, dequantized))


def test_spellings_and_bad_names() -> None:
    assert normalize_quantization("Q4K") == "q4_k"
    assert normalize_quantization("q5_1") == "q5_1"
    assert normalize_quantization("FP8") == "fp8"
    assert EngineArgs(quantization="q6k").quantization == "q6_k"
    with pytest.raises(ValueError, match="unknown quantization 'q7k'"):
        EngineArgs(quantization="q7k")


def test_llm_quantizes_in_situ_through_the_public_api(tiny_llama_dir: str) -> None:
    from transformers import AutoModelForCausalLM

    from wick import LLM, SamplingParams

    llm = LLM(tiny_llama_dir, quantization="q8_0", max_model_len=128, max_num_seqs=2)
    layer = llm.core.executor.worker.runner.model.model.layers[0].mlp.gate_up_proj
    assert [part.qtype for part in layer.gguf_parts] == [T.Q8_0]
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    reference = reference_with(hf, lambda _, w: _dequantized_by_gguf(quantize(w, T.Q8_0), T.Q8_0, tuple(w.shape)))
    ids = torch.randint(3, hf.config.vocab_size, (12,), generator=torch.Generator().manual_seed(0)).tolist()
    out = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
    with torch.no_grad():
        expected = torch.log_softmax(reference(torch.tensor([ids])).logits[0], dim=-1)
    for position, entry in enumerate(out.prompt_logprobs[1:]):
        assert abs(entry[ids[position + 1]].logprob - expected[position, ids[position + 1]].item()) < 1e-3
