"""Putting a ModelSource's weights into a model."""

from __future__ import annotations

import struct
import sys

import torch
from torch import nn
from tqdm import tqdm

from wick.loader.dummy import initialize_dummy_weights
from wick.loader.gguf_loader import iter_gguf_weights
from wick.loader.model_source import ModelSource
from wick.loader.safetensors_loader import count_safetensors_tensors, iter_safetensors_weights

_MISSING_SHOWN = 20


def load_weights(model: nn.Module, source: ModelSource, seed: int = 0, show_progress: bool = True) -> None:
    """Load `source`'s weights through `model.load_weights` ((HF name, tensor) pairs in, the set of
    loaded parameter names out), with a progress bar on stderr if `show_progress`; ValueError if any parameter stays
    unloaded. A dummy source gets random weights from `seed` instead."""
    if source.kind == "dummy":
        initialize_dummy_weights(model, seed=seed)
        return
    if source.kind == "safetensors":
        weights, total = iter_safetensors_weights(source.path), count_safetensors_tensors(source.path)
    else:
        weights, total = iter_gguf_weights(source.gguf_file), _gguf_tensor_count(source.gguf_file)
    with torch.no_grad():
        loaded = model.load_weights(tqdm(weights, total=total, desc="Loading weights", unit="tensor",
                                         file=sys.stderr, disable=not show_progress))
    missing = sorted({name for name, _ in model.named_parameters()} - set(loaded))
    if missing:
        shown = ", ".join(missing[:_MISSING_SHOWN])
        more = f" and {len(missing) - _MISSING_SHOWN} more" if len(missing) > _MISSING_SHOWN else ""
        raise ValueError(f"{source.path} lacks weights for {len(missing)} of the model's parameters: "
                         f"{shown}{more}")


def _gguf_tensor_count(path: str) -> int:
    # The GGUF header: magic, version (uint32), tensor count (uint64), metadata count (uint64).
    with open(path, "rb") as f:
        magic, _, count, _ = struct.unpack("<4sIQQ", f.read(24))
    if magic != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    return count
