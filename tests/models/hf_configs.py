"""Small random-weight configs of each supported architecture, HF models built from them as oracles,
and ours loaded from those."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, PretrainedConfig, Qwen2Config, Qwen3Config

from wick.models.registry import get_model_class

_COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    initializer_range=0.3,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=None,  # no early stop and no EOS masking: we decode a fixed number of tokens
    pad_token_id=0,
)


def hf_configs() -> dict[str, PretrainedConfig]:
    llama3_rope = {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    }
    return {
        "llama3": LlamaConfig(**_COMMON, rope_parameters=llama3_rope),
        "llama_tied_bias": LlamaConfig(
            **{**_COMMON, "tie_word_embeddings": True}, attention_bias=True, mlp_bias=True, head_dim=32
        ),
        "mistral": MistralConfig(**_COMMON, head_dim=32, sliding_window=None),
        "qwen2": Qwen2Config(**_COMMON),
        "qwen3": Qwen3Config(**_COMMON, head_dim=32),
    }


def hf_model(config: PretrainedConfig) -> torch.nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32).eval()


PROMPT_LENS = [1, 7, 13, 24]


def build_pair(config: PretrainedConfig) -> tuple[torch.nn.Module, torch.nn.Module]:
    """An HF model with every weight random (norms and biases too) and ours loaded from its state_dict."""
    hf = hf_model(config)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if "norm" in name:
                param.normal_(1.0, 0.2)
            elif name.endswith("bias"):
                param.normal_(0.0, 0.2)
    ours = get_model_class([type(hf).__name__])(config).eval()
    loaded = ours.load_weights(hf.state_dict().items())
    assert loaded == {name for name, _ in ours.named_parameters()}
    return hf, ours


def prompts(vocab_size: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, vocab_size, (n,), generator=g).tolist() for n in PROMPT_LENS]
