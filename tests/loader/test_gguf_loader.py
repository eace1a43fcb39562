"""The GGUF loader against transformers' own GGUF loading, and against tiny GGUF files we write."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from wick.loader.gguf_loader import (
    gguf_chat_template,
    gguf_metadata,
    iter_gguf_weights,
    load_gguf_config,
    open_gguf,
)

CONFIG_FIELDS = [
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "rope_parameters",
    "max_position_embeddings", "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id",
]


def _hf_config(config: dict):
    d = dict(config)
    return AutoConfig.for_model(d.pop("model_type"), **d)


def _assert_same_config(ours: dict, expected) -> None:
    built = _hf_config(ours)
    for field in CONFIG_FIELDS:
        assert getattr(built, field, None) == getattr(expected, field, None), field
    # GGUF stores the epsilon as float32; transformers' own GGUF loading keeps that rounding too.
    assert built.rms_norm_eps == pytest.approx(expected.rms_norm_eps, rel=1e-6)


def _assert_same_weights(path: str, model: PreTrainedModel, tied: bool) -> None:
    state = model.state_dict()
    seen = set()
    for name, weight in iter_gguf_weights(path):
        assert weight.dtype == torch.float32
        assert torch.equal(weight, state[name]), name
        seen.add(name)
    assert seen == set(state) - ({"lm_head.weight"} if tied else set())


@pytest.fixture(scope="module")
def fast_transformers_gguf() -> Iterator[None]:
    """transformers parses each GGUF file twice and rebuilds gguf's tensor-name map for every
    module; sharing our reader and caching the map keeps the oracle to seconds instead of minutes."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFReader", open_gguf)
        mp.setattr(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map))
        yield


def _check_real_file(path: str) -> dict:
    directory, name = os.path.split(path)
    config = load_gguf_config(path)
    _assert_same_config(config, AutoConfig.from_pretrained(directory, gguf_file=name))
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    _assert_same_weights(path, model, config["tie_word_embeddings"])
    return config


def test_smollm2_matches_transformers(smollm2_gguf: str, fast_transformers_gguf: None) -> None:
    config = _check_real_file(smollm2_gguf)
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert config["tie_word_embeddings"] and not config["attention_bias"]
    assert "rope_scaling" not in config
    assert "<|im_start|>" in gguf_chat_template(smollm2_gguf)
    assert gguf_metadata(smollm2_gguf)["general.architecture"] == "llama"


@pytest.mark.slow
def test_qwen_matches_transformers(qwen_gguf: str, fast_transformers_gguf: None) -> None:
    config = _check_real_file(qwen_gguf)
    assert config["model_type"] == "qwen2" and config["architectures"] == ["Qwen2ForCausalLM"]
    # This file stores its own output matrix, so it is not tied even though the HF checkpoint is.
    assert not config["tie_word_embeddings"] and config["attention_bias"]


_GGUF_LAYER_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def _gguf_name(hf_name: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf_name in top:
        return top[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_GGUF_LAYER_NAMES[module]}.{kind}"


def _interleave_rotary_rows(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """llama.cpp's conversion of HF Q/K rows to its interleaved rotary layout."""
    return w.reshape(num_heads, 2, w.shape[0] // num_heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _write_gguf(path: Path, model: PreTrainedModel, rope_freqs: torch.Tensor | None = None) -> None:
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), cfg.model_type)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    if cfg.rope_parameters["rope_type"] == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(cfg.rope_parameters["factor"])
    writer.add_bos_token_id(cfg.bos_token_id)
    writer.add_eos_token_id(cfg.eos_token_id)
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", rope_freqs.numpy().astype(np.float32))
    heads = {"q_proj": cfg.num_attention_heads, "k_proj": cfg.num_key_value_heads}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        module = name.rsplit(".", 2)[-2]
        if cfg.model_type == "llama" and module in heads:
            tensor = _interleave_rotary_rows(tensor, heads[module])
        writer.add_tensor(_gguf_name(name), tensor.numpy().astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _tiny_model(model_type: str, **overrides) -> PreTrainedModel:
    torch.manual_seed(0)
    sizes = dict(vocab_size=96, hidden_size=128, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2)
    config = AutoConfig.for_model(model_type, **(sizes | overrides))
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def test_llama3_rope_and_rotary_rows_round_trip(tmp_path: Path) -> None:
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}
    model = _tiny_model("llama", head_dim=64, num_attention_heads=2, num_key_value_heads=1,
                        attention_bias=True, tie_word_embeddings=True, rope_parameters=rope)
    default = 500000.0 ** -(torch.arange(0, 64, 2, dtype=torch.float32) / 64)
    path = tmp_path / "tiny-llama.gguf"
    _write_gguf(path, model, rope_freqs=default / model.model.rotary_emb.inv_freq)
    config = load_gguf_config(path)
    assert config["rope_scaling"] == {k: v for k, v in rope.items() if k != "rope_theta"}
    assert config["attention_bias"] and config["tie_word_embeddings"]
    _assert_same_config(config, model.config)
    _assert_same_weights(str(path), model, tied=True)


def test_qwen3_norms_head_dim_and_linear_rope(tmp_path: Path) -> None:
    rope = {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 2.0}
    model = _tiny_model("qwen3", head_dim=48, tie_word_embeddings=False, rope_parameters=rope)
    path = tmp_path / "tiny-qwen3.gguf"
    _write_gguf(path, model)
    config = load_gguf_config(path)
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["head_dim"] == 48
    assert not config["attention_bias"]
    _assert_same_config(config, model.config)
    _assert_same_weights(str(path), model, tied=False)
