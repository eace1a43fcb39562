"""Test helper: a small random Llama, ours loaded from a (quantized) checkpoint of it, and the HF
model holding the weights that checkpoint dequantizes to, as the oracle."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from paged_generate import PagedRunner, Sequence
from transformers import AutoModelForCausalLM, LlamaConfig

from wick.layers.quantization.base import QuantizationConfig, quantization_scope
from wick.loader.weights import load_weights
from wick.models.registry import get_model_class

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def small_llama(hidden: int = 256, intermediate: int = 512) -> torch.nn.Module:
    config = LlamaConfig(vocab_size=256, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         initializer_range=0.05, tie_word_embeddings=False, bos_token_id=1, eos_token_id=None)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32).eval()


def is_projection(name: str) -> bool:
    return name.endswith(".weight") and name.split(".")[-2] in PROJECTIONS


def build_ours(config: LlamaConfig, quant_config: QuantizationConfig | None,
               checkpoint: Iterable[tuple[str, torch.Tensor]]) -> torch.nn.Module:
    with quantization_scope(quant_config):
        model = get_model_class(["LlamaForCausalLM"])(config).eval()
    with torch.no_grad():
        model.load_weights(checkpoint)
    for module in model.modules():
        if hasattr(module, "quant_method"):
            module.quant_method.process_weights_after_loading(module)
    return model


def reference_with(hf: torch.nn.Module, dequantized: Callable[[str, torch.Tensor], torch.Tensor]) -> torch.nn.Module:
    """A copy of `hf` whose projection weights are replaced by dequantized(name, weight)."""
    ref = type(hf)(hf.config).eval()
    state = {name: dequantized(name, t) if is_projection(name) else t for name, t in hf.state_dict().items()}
    ref.load_state_dict(state)
    return ref


def assert_same_logits(ours: torch.nn.Module, reference: torch.nn.Module, atol: float = 1e-4) -> None:
    prompt = torch.randint(3, 256, (21,), generator=torch.Generator().manual_seed(3)).tolist()
    (logits,) = PagedRunner(ours).step([(Sequence(prompt), len(prompt))])
    with torch.no_grad():
        expected = reference(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(logits, expected, atol=atol, rtol=1e-4)


__all__ = ["assert_same_logits", "build_ours", "is_projection", "load_weights", "reference_with", "small_llama"]
