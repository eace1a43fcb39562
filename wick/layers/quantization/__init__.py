"""Weight formats of linear layers, one module per format, and how a model's format is chosen.

`resolve_quantization` reads what the user asked for (`--quantization`) and what the checkpoint is
(a GGUF file, a config.json `quantization_config`), and returns the config whose methods the
linear layers take, or None for plain weights. Every refusal is a one-line ValueError.
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

from wick.layers.quantization.base import QuantizationConfig

# In-situ quantization targets: GGUF block types (candle-vllm's `--isq` spellings too) and fp8.
ISQ_TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k")
_ALIASES = {name.replace("_", ""): name for name in ISQ_TYPES}
CHECKPOINT_METHODS = ("gguf", "gptq", "awq", "fp8")
QUANTIZATION_CHOICES = (*ISQ_TYPES, *CHECKPOINT_METHODS)


def normalize_quantization(name: str | None) -> str | None:
    """The canonical spelling of a --quantization value (q4k -> q4_k), None for none; ValueError if unknown."""
    if name is None or name.lower() in ("none", "auto", ""):
        return None
    key = name.lower().replace("-", "_")
    key = _ALIASES.get(key, key)
    if key not in QUANTIZATION_CHOICES:
        raise ValueError(f"unknown quantization {name!r}; choose one of {', '.join(QUANTIZATION_CHOICES)} "
                         f"(candle's spellings such as q4k are accepted too)")
    return key


def checkpoint_quantization(hf_config: PretrainedConfig) -> dict[str, Any] | None:
    """config.json's quantization_config, if any, as a dict."""
    qc = getattr(hf_config, "quantization_config", None)
    if qc is None:
        return None
    return dict(qc) if isinstance(qc, dict) else qc.to_dict()


def resolve_quantization(requested: str | None, kind: str, hf_config: PretrainedConfig,
                         gguf_file_type: int | None = None) -> QuantizationConfig | None:
    """The quantization config for a model of source `kind` ("safetensors", "gguf", "dummy")."""
    name = normalize_quantization(requested)
    stored = checkpoint_quantization(hf_config)
    if kind == "gguf":
        if name in (None, "gguf"):
            from wick.layers.quantization.gguf import GGUFConfig

            return GGUFConfig(gguf_file_type)
        if name not in (*ISQ_TYPES, "fp8"):
            raise ValueError(f"a GGUF file cannot be loaded as {name}: its weights are GGUF blocks")
        return _in_situ(name)
    if name == "gguf":
        raise ValueError("quantization gguf needs a .gguf file")
    if stored is not None:
        method = str(stored.get("quant_method", "")).lower()
        if name is not None and name != method:
            raise ValueError(f"the checkpoint is quantized with {method or 'an unnamed method'}; "
                             f"it cannot be loaded as {name}")
        return _from_checkpoint(method, stored)
    if name in ("gptq", "awq") and kind == "dummy":
        # Random weights in the format's usual shape: 4-bit, groups of 128.
        return _from_checkpoint(name, {"quant_method": name, "bits": 4, "group_size": 128})
    if name in ("gptq", "awq"):
        raise ValueError(f"quantization {name} needs a checkpoint whose config.json has a {name} "
                         "quantization_config; for in-situ quantization choose one of "
                         f"{', '.join(ISQ_TYPES)} or fp8")
    return _in_situ(name) if name is not None else None


def _in_situ(name: str) -> QuantizationConfig:
    if name == "fp8":
        from wick.layers.quantization.fp8 import Fp8Config

        return Fp8Config(in_situ=True)
    from wick.layers.quantization.isq import InSituGGUFConfig

    return InSituGGUFConfig(name)


def _from_checkpoint(method: str, stored: dict[str, Any]) -> QuantizationConfig:
    if method == "gptq":
        from wick.layers.quantization.gptq import GPTQConfig

        return GPTQConfig.from_config(stored)
    if method == "awq":
        from wick.layers.quantization.awq import AWQConfig

        return AWQConfig.from_config(stored)
    if method == "fp8":
        from wick.layers.quantization.fp8 import Fp8Config

        return Fp8Config.from_config(stored)
    raise ValueError(f"quantization_config quant_method {method!r} is not supported; supported: gptq, awq, fp8")
