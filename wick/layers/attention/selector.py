"""Choosing the attention backend at start-up."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch

from wick.layers.attention.backend import AttentionBackend
from wick.layers.attention.torch_backend import TorchAttentionBackend


def _triton() -> AttentionBackend:
    # Imported only when chosen: Triton decides at import whether it compiles the kernels or, under
    # TRITON_INTERPRET=1, interprets them, and CPU-only runs should not pay for importing it.
    from wick.layers.attention.triton_backend import TritonAttentionBackend

    return TritonAttentionBackend()


_BACKENDS: dict[str, Callable[[], AttentionBackend]] = {"torch": TorchAttentionBackend, "triton": _triton}


def _default_backend(device: torch.device) -> str:
    if device.type != "cuda":
        return "torch"
    if "flashinfer" in _BACKENDS and importlib.util.find_spec("flashinfer") is not None:
        return "flashinfer"
    return "triton"


def get_attention_backend(name: str | None, device: torch.device) -> AttentionBackend:
    """name None picks the best backend available on device."""
    name = name or _default_backend(device)
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r} for {device}; available: {', '.join(_BACKENDS)}")
    return _BACKENDS[name]()
