"""What every benchmark prints beside its figures: the machine, the versions, the copy bandwidth."""

from __future__ import annotations

import datetime
import math
import platform

import torch
import transformers


def environment() -> dict[str, str]:
    info = {
        "date": datetime.date.today().isoformat(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["device"] = f"{props.name} ({props.total_memory / 2**30:.0f} GiB)"
    else:
        info["device"] = "cpu"
    return info


def copy_bandwidth(num_bytes: int = 2 << 30, repeats: int = 10) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read and written."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000 / repeats
    del src, dst
    torch.cuda.empty_cache()
    return 2 * num_bytes / seconds


def weight_bytes(model: torch.nn.Module, tokens: int = 1) -> int:
    """Bytes a forward pass of `tokens` tokens must read: every weight once, packed as held (the embedding
    table only sparsely); of each mixture-of-experts layer only the experts hit, expected 1 - (1 - k/E)^tokens
    of them under uniform routing (k/E for one token)."""
    from wick.layers.moe.fused_moe import FusedMoE
    from wick.loader.weights import weights_nbytes

    unread = 0.0
    for module in model.modules():
        if isinstance(module, FusedMoE):
            share = 1 - (1 - module.spec.top_k / module.spec.num_experts) ** tokens
            unread += sum(w.numel() * w.element_size() for w in module.parameters()) * (1 - share)
    return weights_nbytes(model, skip_embedding=True) - int(unread)


def kv_bytes_per_token(model: torch.nn.Module) -> int:
    elem = next(model.parameters()).element_size()
    return sum(elem * math.prod(shape) for m in model.modules() if hasattr(m, "kv_cache_shapes")
               for shape in m.kv_cache_shapes(1, 1))


def print_environment() -> None:
    print(" | ".join(f"{k} {v}" for k, v in environment().items()))


def random_gguf_blocks(qtype: object, *shape: int, device: str = "cuda") -> torch.Tensor:
    """Random blocks of a quantized GGUF type (`qtype`), uint8 [*shape[:-1], row bytes] for rows of shape[-1] values,
    on `device`: random codes and sub-block scales with every float16 field (d, and dmin or m where the type has one)
    1e-3, so that no decoded value overflows."""
    from gguf import GGML_QUANT_SIZES
    from gguf import GGMLQuantizationType as T

    halves = {T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,), T.Q2_K: (80, 82),
              T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,), T.IQ4_NL: (0,), T.IQ4_XS: (0,)}[qtype]
    block, size = GGML_QUANT_SIZES[qtype]
    *rows, columns = shape
    blocks = torch.randint(0, 256, (*rows, columns // block, size), dtype=torch.uint8, device=device)
    scale = torch.full((*rows, columns // block, 1), 1e-3, dtype=torch.float16, device=device).view(torch.uint8)
    for offset in halves:
        blocks[..., offset:offset + 2] = scale
    return blocks.reshape(*rows, -1)
