"""Reading a GGUF file as a Hugging Face checkpoint: config.json fields and named weights.

The file is opened once per path through a memory map (``gguf.GGUFReader``); tensors are
dequantized one at a time as they are iterated, or handed out packed (views of the map).
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Iterator
from typing import Any

import torch
from gguf import GGUFReader, ReaderTensor

from wick.layers.quantization.gguf import GGUFWeight
from wick.loader.file_pages import register_file_map
from wick.loader.gguf_dequant import as_bytes, dequantize

_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen2moe": "Qwen2MoeForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",
}
# HF model_type of each GGUF architecture, where the names differ; llama with experts is Mixtral
_MODEL_TYPES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe"}

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
# every expert's matrices stacked in one tensor [experts, out, in] -> HF's per-expert projection
_EXPERT_NAMES = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}

# Tensors that HF checkpoints do not have; rope_freqs is folded into the config's rope_scaling.
_SKIPPED = {"rope_freqs.weight"}

_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")

_TOKEN_IDS = {
    "bos_token_id": "tokenizer.ggml.bos_token_id",
    "eos_token_id": "tokenizer.ggml.eos_token_id",
    "pad_token_id": "tokenizer.ggml.padding_token_id",
}


@functools.lru_cache(maxsize=2)
def _reader(path: str) -> GGUFReader:
    reader = GGUFReader(path)
    register_file_map(reader.data)
    return reader


def open_gguf(path: str | os.PathLike[str]) -> GGUFReader:
    """A memory-mapped reader of the file, shared by every caller: opening one parses all metadata
    fields (the vocabulary too), which takes seconds on big files."""
    return _reader(os.path.realpath(path))


def _field(reader: GGUFReader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _tensors(reader: GGUFReader) -> dict[str, ReaderTensor]:
    return {t.name: t for t in reader.tensors}


def _torch_shape(tensor: ReaderTensor) -> tuple[int, ...]:
    """GGUF lists dimensions fastest-first; torch wants them slowest-first."""
    return tuple(int(d) for d in reversed(tensor.shape))


def close_gguf_readers() -> None:
    """Forgets the parsed readers: their metadata (the vocabulary as hundreds of thousands of small arrays) takes
    about the file's size in memory. Loaded weights keep the file's memory map itself alive."""
    _reader.cache_clear()


def gguf_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Every key-value metadata field of the file, as Python values (arrays become lists)."""
    reader = open_gguf(path)
    return {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}


def gguf_chat_template(path: str | os.PathLike[str]) -> str | None:
    """The Jinja chat template stored in the file, if any."""
    return _field(open_gguf(path), "tokenizer.chat_template")


def _llama3_rope_scaling(rope_factors: torch.Tensor, rope_theta: float) -> dict[str, Any]:
    """Recover HF's llama3 rope_scaling from llama.cpp's per-frequency divisors.

    llama.cpp stores, for each rotary frequency, how much the llama3 scheme divides it by: 1 for
    short wavelengths, ``factor`` for long ones, and in between
    ``1 / ((1 - s) / factor + s)`` with ``s = (original_ctx / wavelength - low) / (high - low)``.
    ``s`` is affine in 1 / wavelength, so a line through the in-between entries gives
    ``original_ctx / (high - low)`` and ``-low / (high - low)``; these fix the three parameters once
    ``low_freq_factor`` is taken to be 1, as in every Llama 3.x release.
    """
    factors = rope_factors.double()
    factor = float(factors.max())
    dim = 2 * factors.numel()
    inv_freq = rope_theta ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    inv_wavelength = inv_freq / (2 * math.pi)
    between = (factors > 1 + 1e-4) & (factors < factor - 1e-4)
    if int(between.sum()) < 2:
        raise ValueError("cannot recover llama3 rope scaling: rope_freqs has too few smoothed entries")
    smooth = (1 / factors[between] - 1 / factor) / (1 - 1 / factor)
    x = inv_wavelength[between]
    line = torch.linalg.lstsq(torch.stack([x, torch.ones_like(x)], dim=1), smooth[:, None]).solution
    slope, intercept = line[:, 0].tolist()
    span = -1 / intercept
    return {
        "rope_type": "llama3",
        "factor": round(factor, 4),
        "low_freq_factor": 1.0,
        "high_freq_factor": round(1 + span, 4),
        "original_max_position_embeddings": round(slope * span),
    }


def _rope_scaling(reader: GGUFReader, arch: str, rope_theta: float) -> dict[str, Any] | None:
    kind = _field(reader, f"{arch}.rope.scaling.type")
    factor = _field(reader, f"{arch}.rope.scaling.factor")
    legacy_linear = _field(reader, f"{arch}.rope.scale_linear")
    if kind == "linear" or (kind is None and legacy_linear is not None):
        return {"rope_type": "linear", "factor": factor if factor is not None else legacy_linear}
    if kind == "yarn":
        scaling = {"rope_type": "yarn", "factor": factor}
        original = _field(reader, f"{arch}.rope.scaling.original_context_length")
        if original is not None:
            scaling["original_max_position_embeddings"] = original
        return scaling
    if kind not in (None, "none"):
        raise ValueError(f"unsupported GGUF rope scaling type {kind!r}")
    freqs = _tensors(reader).get("rope_freqs.weight")
    if freqs is None:
        return None
    return _llama3_rope_scaling(dequantize(freqs.data, freqs.tensor_type, _torch_shape(freqs)), rope_theta)


def load_gguf_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """An HF-style config.json dict for the model in a GGUF file (llama, qwen2, qwen3, and with experts
    qwen2moe, qwen3moe and llama = Mixtral)."""
    reader = open_gguf(path)
    arch = _field(reader, "general.architecture")
    if arch not in _ARCHITECTURES:
        raise ValueError(f"GGUF architecture {arch!r} is not supported; supported: {sorted(_ARCHITECTURES)}")

    def arch_field(key: str, default: Any = None) -> Any:
        return _field(reader, f"{arch}.{key}", default)

    tensors = _tensors(reader)
    num_heads = arch_field("attention.head_count")
    rope_theta = arch_field("rope.freq_base", 10000.0)
    config: dict[str, Any] = {
        "model_type": _MODEL_TYPES.get(arch, arch),
        "architectures": [_ARCHITECTURES[arch]],
        "vocab_size": _torch_shape(tensors["token_embd.weight"])[0],
        "hidden_size": arch_field("embedding_length"),
        "intermediate_size": arch_field("feed_forward_length"),
        "num_hidden_layers": arch_field("block_count"),
        "num_attention_heads": num_heads,
        "num_key_value_heads": arch_field("attention.head_count_kv", num_heads),
        "rms_norm_eps": arch_field("attention.layer_norm_rms_epsilon"),
        "rope_theta": rope_theta,
        "max_position_embeddings": arch_field("context_length"),
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "torch_dtype": "float32",
    }
    num_experts = arch_field("expert_count")
    if num_experts:
        config.update(_moe_config(arch, arch_field, tensors, num_experts))
    head_dim = arch_field("attention.key_length")
    if head_dim is not None:
        config["head_dim"] = head_dim
    for key, gguf_key in _TOKEN_IDS.items():
        token_id = _field(reader, gguf_key)
        if token_id is not None:
            config[key] = token_id
    rope_scaling = _rope_scaling(reader, arch, rope_theta)
    if rope_scaling is not None:
        config["rope_scaling"] = rope_scaling
    return config


def _moe_config(arch: str, arch_field: Any, tensors: dict[str, ReaderTensor], num_experts: int) -> dict[str, Any]:
    if "blk.0.ffn_gate_exps.weight" not in tensors:
        raise ValueError("GGUF experts stored one tensor per expert (old llama.cpp files) are not supported; "
                         "convert the model again with a current llama.cpp")
    config: dict[str, Any] = {"num_experts_per_tok": arch_field("expert_used_count")}
    if arch == "llama":
        config.update(model_type="mixtral", architectures=["MixtralForCausalLM"], num_local_experts=num_experts)
        return config
    config.update(model_type=_MODEL_TYPES[arch], num_experts=num_experts,
                  moe_intermediate_size=arch_field("expert_feed_forward_length"),
                  # Qwen3-MoE releases renormalise the top-k weights, Qwen1.5/2-MoE releases do not
                  norm_topk_prob=arch_field("expert_weights_norm", arch == "qwen3moe"))
    if arch == "qwen2moe":
        config["shared_expert_intermediate_size"] = arch_field("expert_shared_feed_forward_length")
        config["qkv_bias"] = "blk.0.attn_q.bias" in tensors
    return config


def _hf_name(gguf_name: str) -> str | None:
    """The HF parameter name of a GGUF tensor, or None for tensors HF models do not have."""
    if gguf_name in _SKIPPED:
        return None
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _LAYER_TENSOR.fullmatch(gguf_name)
    if match is None or match[2] not in _LAYER_NAMES:
        raise ValueError(f"unexpected GGUF tensor {gguf_name!r}")
    return f"model.layers.{match[1]}.{_LAYER_NAMES[match[2]]}.{match[3]}"


def _unpermute_rotary_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row order: per head it interleaves the two rotary halves
    (rows 0, d/2, 1, d/2+1, ...); HF keeps the halves apart."""
    rows = weight.shape[0]
    return weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:]).transpose(1, 2).reshape(
        weight.shape
    )


def gguf_file_type(path: str | os.PathLike[str]) -> int | None:
    """llama.cpp's file type (``general.file_type``: 15 is Q4_K_M), if the file says."""
    return _field(open_gguf(path), "general.file_type")


def _packed(tensor: ReaderTensor) -> GGUFWeight:
    rows, columns = _torch_shape(tensor)
    return GGUFWeight(as_bytes(tensor.data).reshape(rows, -1), tensor.tensor_type, (rows, columns))


def iter_gguf_weights(path: str | os.PathLike[str],
                      packed: bool = False) -> Iterator[tuple[str, torch.Tensor | GGUFWeight]]:
    """Yield (HF name, tensor) for each tensor of a GGUF file: float32, dequantized one by one, or
    with `packed` every matrix (each expert's too) as a GGUFWeight (its blocks as stored) and the vectors as
    float32.

    lm_head.weight appears only when the file has its own output matrix; otherwise the config
    says tie_word_embeddings.
    """
    reader = open_gguf(path)
    config = load_gguf_config(path)
    rotary_heads = {}
    if config["model_type"] in ("llama", "mixtral"):
        rotary_heads = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}
    for tensor in reader.tensors:
        expert = _LAYER_TENSOR.fullmatch(tensor.name)
        if expert is not None and expert[2] in _EXPERT_NAMES:
            prefix, kind = f"model.layers.{expert[1]}.mlp.experts", _EXPERT_NAMES[expert[2]]
            if packed:
                experts, rows, columns = _torch_shape(tensor)
                stacked = GGUFWeight(as_bytes(tensor.data).reshape(experts * rows, -1), tensor.tensor_type,
                                     (experts * rows, columns))
                for e in range(experts):
                    yield f"{prefix}.{e}.{kind}.weight", stacked.rows(e * rows, rows)
                continue
            stacked = dequantize(tensor.data, tensor.tensor_type, _torch_shape(tensor))
            for e in range(stacked.shape[0]):
                yield f"{prefix}.{e}.{kind}.weight", stacked[e]
            continue
        name = _hf_name(tensor.name)
        if name is None:
            continue
        module = name.rsplit(".", 2)[-2]
        if packed and len(tensor.shape) == 2:
            weight = _packed(tensor)
            if module in rotary_heads:
                weight = GGUFWeight(_unpermute_rotary_rows(weight.data, rotary_heads[module]), weight.qtype,
                                    weight.shape)
            yield name, weight
            continue
        weight = dequantize(tensor.data, tensor.tensor_type, _torch_shape(tensor))
        if name.endswith("shared_expert_gate.weight"):
            weight = weight.reshape(1, -1)  # llama.cpp stores the one-row gate as a vector
        if module in rotary_heads:
            weight = _unpermute_rotary_rows(weight, rotary_heads[module])
        yield name, weight
