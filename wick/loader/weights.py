"""Putting a ModelSource's weights into a model."""

from __future__ import annotations

import logging
import struct
import sys

import torch
from torch import nn
from tqdm import tqdm

from wick.layers.moe.fused_moe import FusedMoE
from wick.layers.quantization.base import QuantizationConfig
from wick.layers.vocab_embedding import ParallelLMHead
from wick.loader.dummy import initialize_dummy_weights
from wick.loader.file_pages import trim_heap
from wick.loader.gguf_loader import close_gguf_readers, iter_gguf_weights
from wick.loader.model_source import ModelSource
from wick.loader.safetensors_loader import count_safetensors_tensors, iter_safetensors_weights

logger = logging.getLogger(__name__)

_MISSING_SHOWN = 20


def load_weights(model: nn.Module, source: ModelSource, seed: int = 0, show_progress: bool = True,
                 quant_config: QuantizationConfig | None = None) -> None:
    """Load `source`'s weights through `model.load_weights` ((HF name, tensor) pairs in, the set of
    loaded parameter names out), with a progress bar on stderr if `show_progress`; ValueError if any parameter
    stays unloaded. A dummy source gets random weights from `seed` instead. Then each quantized layer's
    method repacks its weights, and the log says the weights' format and size."""
    if source.kind == "dummy":
        initialize_dummy_weights(model, seed=seed)
    else:
        packed = quant_config is not None and quant_config.packs_gguf()
        desc = f"Loading weights as {quant_config.describe()}" if quant_config is not None else "Loading weights"
        _load_checkpoint(model, source, packed, desc, show_progress)
        if source.kind == "gguf":
            close_gguf_readers()
    process_weights_after_loading(model)
    device = next(model.parameters()).device
    if device.type == "cpu":
        trim_heap()
    name = quant_config.describe() if quant_config is not None else _weights_dtype(model)
    logger.info("weights: %s, %.2f GiB on %s", name, weights_nbytes(model) / (1 << 30), device)


def process_weights_after_loading(model: nn.Module) -> None:
    """Each quantized layer's method repacks its loaded weights; a packed LM head gets its CPU form and an MoE
    layer with one of its two expert tensors packed decodes it."""
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(module)
        elif isinstance(module, (ParallelLMHead, FusedMoE)):
            module.process_weights_after_loading()


def _load_checkpoint(model: nn.Module, source: ModelSource, packed: bool, desc: str, show_progress: bool) -> None:
    if source.kind == "safetensors":
        weights, total = iter_safetensors_weights(source.path), count_safetensors_tensors(source.path)
    else:
        weights = iter_gguf_weights(source.gguf_file, packed=packed)
        total = _gguf_tensor_count(source.gguf_file)
    with torch.no_grad():
        loaded = model.load_weights(tqdm(weights, total=total, desc=desc, unit="tensor",
                                         file=sys.stderr, disable=not show_progress))
    required = {name for name, param in model.named_parameters() if not getattr(param, "optional", False)}
    missing = sorted(required - set(loaded))
    if missing:
        shown = ", ".join(missing[:_MISSING_SHOWN])
        more = f" and {len(missing) - _MISSING_SHOWN} more" if len(missing) > _MISSING_SHOWN else ""
        raise ValueError(f"{source.path} lacks weights for {len(missing)} of the model's parameters: "
                         f"{shown}{more}")


def _weights_dtype(model: nn.Module) -> str:
    """The dtype most of an unquantized model's weight bytes are in, as torch spells it ("bfloat16")."""
    nbytes: dict[torch.dtype, int] = {}
    for p in model.parameters():
        nbytes[p.dtype] = nbytes.get(p.dtype, 0) + p.numel() * p.element_size()
    return str(max(nbytes, key=nbytes.get)).removeprefix("torch.")


def weights_nbytes(model: nn.Module, skip_embedding: bool = False) -> int:
    """Bytes of the model's weights as held: parameters (shared ones once) and what quantization methods
    hold beside them; `skip_embedding` leaves out an untied input embedding (a forward reads it sparsely)."""
    seen: set[int] = set()
    total = 0
    tensors = [p.data for name, p in model.named_parameters()
               if not (skip_embedding and "embed_tokens" in name and not model.config.tie_word_embeddings)]
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is not None:
            tensors += method.held_tensors(module)
    for tensor in tensors:
        key = tensor.data_ptr()
        if tensor.numel() and key not in seen:
            seen.add(key)
            total += tensor.numel() * tensor.element_size()
    return total


def _gguf_tensor_count(path: str) -> int:
    # The GGUF header: magic, version (uint32), tensor count (uint64), metadata count (uint64).
    with open(path, "rb") as f:
        magic, _, count, _ = struct.unpack("<4sIQQ", f.read(24))
    if magic != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    return count
