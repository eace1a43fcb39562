"""Choosing the attention backend at start-up."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from wick.layers.attention.backend import AttentionBackend
from wick.layers.attention.torch_backend import TorchAttentionBackend

logger = logging.getLogger(__name__)


def _triton() -> AttentionBackend:
    # Imported only when chosen: Triton decides at import whether it compiles the kernels or, under
    # TRITON_INTERPRET=1, interprets them, and CPU-only runs should not pay for importing it.
    from wick.layers.attention.triton_backend import TritonAttentionBackend

    return TritonAttentionBackend()


def _flashinfer() -> AttentionBackend:
    from wick.layers.attention.flashinfer_backend import FlashInferAttentionBackend

    return FlashInferAttentionBackend()


def _flashinfer_imports() -> bool:
    try:
        import flashinfer  # noqa: F401
    except ModuleNotFoundError:
        return False
    except Exception as e:  # installed but broken (CUDA libraries, tvm-ffi): fall back rather than fail
        logger.warning("flashinfer does not import (%s); using the triton attention backend", e)
        return False
    return True


_BACKENDS: dict[str, Callable[[], AttentionBackend]] = {
    "torch": TorchAttentionBackend, "triton": _triton, "flashinfer": _flashinfer}


def _default_backend(device: torch.device) -> str:
    if device.type != "cuda":
        return "torch"
    if "flashinfer" in _BACKENDS and _flashinfer_imports():
        return "flashinfer"
    return "triton"


def get_attention_backend(name: str | None, device: torch.device,
                          kv_cache_dtype: torch.dtype | None = None) -> AttentionBackend:
    """name None picks the best backend available on device; ValueError if it cannot hold kv_cache_dtype."""
    name = name or _default_backend(device)
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r} for {device}; available: {', '.join(_BACKENDS)}")
    if kv_cache_dtype == torch.float8_e4m3fn and name != "torch" and device.type == "cuda" \
            and torch.cuda.get_device_capability(device) < (8, 9):
        raise ValueError(f"the {name} attention backend needs a GPU of compute capability 8.9 or more for an "
                         "fp8 KV cache; use --attention-backend torch or the model's dtype")
    return _BACKENDS[name]()
