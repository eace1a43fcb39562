"""Loading a tokenizer: from a local folder, an HF model id (local cache first), or a GGUF file."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase

_TRUE = ("1", "true", "yes", "on")
# The files a tokenizer is loaded from; a folder with none of them has no tokenizer.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                    "spiece.model")


def get_tokenizer(path: str, gguf_file: str | None = None,
                  trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """The tokenizer of a model folder, an HF model id, or a GGUF file.

    A GGUF file is named either as `path` itself (ending in `.gguf`: a local file, or `org/repo/file.gguf`
    on the HF hub) or as `gguf_file` inside `path` (a folder or an HF model id); its tokenizer and chat
    template come from its metadata. An HF id is
    looked up in the local cache and downloaded only when the network is allowed (`HF_HUB_OFFLINE`).
    """
    if gguf_file is None and path.endswith(".gguf"):
        path, gguf_file = os.path.split(path)
    if gguf_file is not None:
        return _gguf_tokenizer(path, gguf_file)
    if os.path.isdir(path):
        if not any(os.path.isfile(os.path.join(path, name)) for name in _TOKENIZER_FILES):
            raise FileNotFoundError(f"no tokenizer in {path} (none of {', '.join(_TOKENIZER_FILES)}); "
                                    "name one with --tokenizer")
        return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code,
                                             local_files_only=_offline())
    except OSError as e:
        raise FileNotFoundError(f"cannot find a tokenizer for {path!r}: {_where_we_looked()}") from e


def eos_token_ids(tokenizer: PreTrainedTokenizerBase,
                  generation_config_or_config: Any = None) -> list[int]:
    """The ids that end generation: the tokenizer's EOS, then each EOS id the (generation) config lists.

    Chat models often list several, e.g. Qwen2.5's generation config lists <|im_end|> and <|endoftext|>,
    Llama 3's <|end_of_text|>, <|eom_id|> and <|eot_id|>. The config may be an object or a dict.
    """
    ids: list[int] = []
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    config = generation_config_or_config
    listed = config.get("eos_token_id") if isinstance(config, Mapping) else getattr(config, "eos_token_id", None)
    if isinstance(listed, int):
        listed = [listed]
    for token_id in listed or []:
        if token_id not in ids:
            ids.append(token_id)
    return ids


def _gguf_tokenizer(location: str, gguf_file: str) -> PreTrainedTokenizerBase:
    local_file = _resolve_gguf(location, gguf_file)
    folder, name = os.path.split(local_file)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    if not tokenizer.chat_template:
        template = gguf_chat_template(local_file)
        if template:
            tokenizer.chat_template = template
    return tokenizer


def gguf_chat_template(gguf_path: str) -> str | None:
    """The `tokenizer.chat_template` string of a GGUF file's metadata, or None when it has none."""
    from gguf import GGUFReader

    field = GGUFReader(gguf_path).get_field("tokenizer.chat_template")
    return None if field is None else field.contents()


def _resolve_gguf(location: str, gguf_file: str) -> str:
    """The local path of `gguf_file`, which is absolute, inside folder `location`, or in HF repo `location`."""
    for candidate in (gguf_file, os.path.join(location, gguf_file)):
        if os.path.isfile(candidate):
            return os.path.abspath(candidate)
    if os.path.isdir(location) or not location:
        raise FileNotFoundError(f"no GGUF file {gguf_file!r} in {location or os.getcwd()!r}")
    from huggingface_hub import hf_hub_download

    try:
        return hf_hub_download(location, gguf_file, local_files_only=_offline())
    except Exception as e:  # the hub raises many kinds; all mean the file is not to be had
        raise FileNotFoundError(
            f"cannot find {gguf_file!r} of {location!r}: {_where_we_looked()} ({type(e).__name__}: {e})") from e


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in _TRUE


def _where_we_looked() -> str:
    if _offline():
        return "it is not a local folder, and not in the local HF cache (HF_HUB_OFFLINE is set)"
    return "it is not a local folder, not in the local HF cache, and could not be downloaded from the HF hub"
