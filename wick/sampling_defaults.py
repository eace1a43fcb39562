"""Sampling defaults for requests that leave a setting out, in three layers (as vLLM does): the model's
`generation_config.json`, then the server's flags (`--temperature`, `--max-gen-tokens`, ...), then the
request's own values. `--generation-config vllm` drops the model's layer."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wick.loader.model_source import ModelSource, is_default_model
from wick.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

# generation_config.json keys -> SamplingParams fields.
_GENERATION_CONFIG_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                           "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}
# What a server flag may set (SamplingParams names).
OVERRIDE_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                 "frequency_penalty", "max_tokens")
# The default model's GGUF file carries no generation config. HuggingFaceTB/SmolLM2-135M-Instruct's own
# generation_config.json sets no sampling (greedy in transformers); see docs/sampling_defaults.md for why the
# model card's temperature 0.2 / top_p 0.9 is not taken.
DEFAULT_MODEL_GENERATION_CONFIG = {"temperature": 0.0}
# A request without max_tokens (and no default from the model or the server) may use this share of the context.
DEFAULT_MAX_TOKENS_SHARE = 5


@dataclass
class SamplingDefaults:
    """`values`: SamplingParams fields a request that omits them gets (max_tokens apart).
    `max_tokens`: the default max_tokens, or None for a fifth of the context (bounded by the room left)."""

    values: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None

    @classmethod
    def resolve(cls, source: ModelSource, generation_config: str = "auto",
                overrides: dict[str, Any] | None = None) -> SamplingDefaults:
        """Raises ValueError for an unusable `generation_config` or override."""
        merged = dict(model_generation_config(source, generation_config))
        unknown = sorted(set(overrides or {}) - set(OVERRIDE_KEYS))
        if unknown:
            raise ValueError(f"unknown sampling defaults {unknown}; known: {', '.join(OVERRIDE_KEYS)}")
        merged.update({k: v for k, v in (overrides or {}).items() if v is not None})
        max_tokens = merged.pop("max_tokens", None)
        SamplingParams(**merged, max_tokens=max_tokens)  # the same checks as a request's own values get
        if merged or max_tokens:
            logger.info("sampling defaults for requests that omit them: %s",
                        ", ".join(f"{k}={v}" for k, v in {**merged, "max_tokens": max_tokens}.items() if v is not None))
        return cls(merged, max_tokens)

    def pick(self, name: str, requested: Any) -> Any:
        """The request's value, else the default, else SamplingParams' own."""
        if requested is not None:
            return requested
        return self.values.get(name, SamplingParams.__dataclass_fields__[name].default)

    def max_tokens_for(self, room: int, max_model_len: int) -> int:
        """A request's max_tokens when it names none: the default, bounded by the room the prompt leaves."""
        default = self.max_tokens or max(1, max_model_len // DEFAULT_MAX_TOKENS_SHARE)
        return max(1, min(room, default))

    def sampling_params(self, max_tokens: int | None, **changes: Any) -> SamplingParams:
        """The settings of a request that names none but `max_tokens` and `changes`."""
        return SamplingParams(**{**self.values, **changes}, max_tokens=max_tokens)


def model_generation_config(source: ModelSource, generation_config: str = "auto") -> dict[str, Any]:
    """The sampling settings a model's publisher gives: `auto` reads the model folder's (or the GGUF file's folder's)
    generation_config.json, `vllm` none, any other value is a folder holding one."""
    if generation_config == "vllm" or source.kind == "dummy":
        return {}
    if generation_config == "auto":
        folder = Path(source.gguf_file).parent if source.gguf_file else Path(source.path)
        if not (folder / "generation_config.json").is_file():
            return dict(DEFAULT_MODEL_GENERATION_CONFIG) if is_default_model(source) else {}
    else:
        folder = Path(generation_config).expanduser()
        if not (folder / "generation_config.json").is_file():
            raise ValueError(f"--generation-config: no generation_config.json in {folder} "
                             "(give 'auto', 'vllm' or a folder holding one)")
    try:
        data = json.loads((folder / "generation_config.json").read_text())
    except ValueError as e:
        raise ValueError(f"{folder / 'generation_config.json'} is not valid JSON: {e}") from None
    return {name: data[key] for key, name in _GENERATION_CONFIG_KEYS.items() if data.get(key) is not None}
