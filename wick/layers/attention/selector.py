"""Choosing the attention backend at start-up."""

from __future__ import annotations

import torch

from wick.layers.attention.backend import AttentionBackend
from wick.layers.attention.torch_backend import TorchAttentionBackend

_BACKENDS: dict[str, type[AttentionBackend]] = {"torch": TorchAttentionBackend}


def get_attention_backend(name: str | None, device: torch.device) -> AttentionBackend:
    """name None picks the best backend available on device."""
    name = name or "torch"
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r} for {device}; available: {', '.join(_BACKENDS)}")
    return _BACKENDS[name]()
