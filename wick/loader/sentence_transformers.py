"""What a sentence-transformers model folder says about its embeddings: modules.json (a Pooling module makes
the folder an embedding model, a Normalize module normalises), the pooling mode in the Pooling module's
config.json, and the longest input in sentence_bert_config.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformers import PretrainedConfig

from wick.layers.pooler import PoolerConfig, PoolingType

_POOLING_MODES = {"pooling_mode_cls_token": PoolingType.CLS, "pooling_mode_mean_tokens": PoolingType.MEAN,
                  "pooling_mode_lasttoken": PoolingType.LAST}
# Modules wick applies itself; any other one (Dense, LayerNorm...) would change the embedding.
_KNOWN_MODULES = ("Transformer", "Pooling", "Normalize")


def _modules(folder: Path) -> list[dict[str, Any]] | None:
    path = folder / "modules.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _kind(module: dict[str, Any]) -> str:
    return str(module.get("type", "")).rsplit(".", 1)[-1]


def is_sentence_transformers(folder: str | None) -> bool:
    """Whether `folder` is a sentence-transformers model: its modules.json lists a Pooling module."""
    modules = _modules(Path(folder)) if folder is not None and Path(folder).is_dir() else None
    return any(_kind(m) == "Pooling" for m in modules or [])


def max_seq_length(folder: str | None) -> int | None:
    """sentence_bert_config.json's max_seq_length: the longest input the model was trained for."""
    path = Path(folder) / "sentence_bert_config.json" if folder is not None else None
    if path is None or not path.is_file():
        return None
    value = json.loads(path.read_text()).get("max_seq_length")
    return int(value) if value else None


def pooler_config(folder: str | None, hf_config: PretrainedConfig, encoder: bool) -> PoolerConfig:
    """The pooling a sentence-transformers folder asks for; without one, vLLM's defaults: the CLS token for an
    encoder, the last token for a decoder, normalised. Matryoshka support comes from the HF config
    (`matryoshka_dimensions` or `is_matryoshka`)."""
    pooling_type = PoolingType.CLS if encoder else PoolingType.LAST
    normalize = True
    root = Path(folder) if folder is not None else None
    modules = _modules(root) if root is not None and root.is_dir() else None
    if modules is not None and root is not None:
        unknown = [_kind(m) for m in modules if _kind(m) not in _KNOWN_MODULES]
        if unknown:
            raise ValueError(f"{root}/modules.json has modules wick cannot apply: {', '.join(unknown)} "
                             f"(only {', '.join(_KNOWN_MODULES)})")
        normalize = any(_kind(m) == "Normalize" for m in modules)
        pooling = next((m for m in modules if _kind(m) == "Pooling"), None)
        if pooling is not None:
            pooling_type = _pooling_type(root / pooling.get("path", "") / "config.json")
    dims = getattr(hf_config, "matryoshka_dimensions", None)
    return PoolerConfig(pooling_type, normalize, int(hf_config.hidden_size),
                        is_matryoshka=bool(dims or getattr(hf_config, "is_matryoshka", False)),
                        matryoshka_dimensions=tuple(dims) if dims else None)


def _pooling_type(path: Path) -> PoolingType:
    config = json.loads(path.read_text())
    chosen = [mode for key, mode in _POOLING_MODES.items() if config.get(key)]
    others = [key for key, value in config.items()
              if key.startswith("pooling_mode") and value and key not in _POOLING_MODES]
    if len(chosen) != 1 or others:
        raise ValueError(f"{path}: wick pools by exactly one of {', '.join(_POOLING_MODES)}; this config asks for "
                         f"{', '.join([k for k in _POOLING_MODES if config.get(k)] + others) or 'none'}")
    return chosen[0]
