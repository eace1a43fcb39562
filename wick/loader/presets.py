"""Configs of well-known models, for `load_format="dummy"` runs on machines without their weights.

Each preset is the model's Hugging Face config.json (the instruct release where there is one), so
that dummy benchmarks run exactly the shapes of the real model.
"""

from __future__ import annotations

from typing import Any

from transformers import AutoConfig, PretrainedConfig

_LLAMA3_COMMON: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 128256,
}

_QWEN_COMMON: dict[str, Any] = {
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

PRESETS: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": {
        **_QWEN_COMMON,
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "attention_bias": False,
        "head_dim": 128,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "max_position_embeddings": 40960,
        "max_window_layers": 28,
        "num_attention_heads": 16,
        "num_hidden_layers": 28,
        "num_key_value_heads": 8,
        "sliding_window": None,
    },
    "qwen2.5-0.5b": {
        **_QWEN_COMMON,
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "max_position_embeddings": 32768,
        "max_window_layers": 21,
        "num_attention_heads": 14,
        "num_hidden_layers": 24,
        "num_key_value_heads": 2,
        "sliding_window": 32768,
    },
    "qwen2.5-32b": {
        **_QWEN_COMMON,
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 5120,
        "intermediate_size": 27648,
        "max_position_embeddings": 32768,
        "max_window_layers": 64,
        "num_attention_heads": 40,
        "num_hidden_layers": 64,
        "num_key_value_heads": 8,
        "sliding_window": 32768,
        "tie_word_embeddings": False,
        "vocab_size": 152064,
    },
    "llama-3.2-1b": {
        **_LLAMA3_COMMON,
        "head_dim": 64,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_attention_heads": 32,
        "num_hidden_layers": 16,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "tie_word_embeddings": True,
    },
    "llama-3.1-8b": {
        **_LLAMA3_COMMON,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "tie_word_embeddings": False,
    },
}


def config_from_dict(values: dict[str, Any]) -> PretrainedConfig:
    """Build the transformers config class named by `values["model_type"]` from a config.json-style dict."""
    rest = dict(values)
    model_type = rest.pop("model_type")
    return AutoConfig.for_model(model_type, **rest)


def get_preset_config(name: str) -> PretrainedConfig:
    """The config of preset `name` (one of `PRESETS`); ValueError for an unknown name."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    return config_from_dict(PRESETS[name])
