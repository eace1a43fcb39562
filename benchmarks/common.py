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
    """Bytes a forward pass of `tokens` tokens must read: every parameter once (the embedding table only
    sparsely); of each mixture-of-experts layer only the experts hit, expected 1 - (1 - k/E)^tokens of
    them under uniform routing (k/E for one token)."""
    from wick.layers.moe.fused_moe import FusedMoE

    expert_share = {f"{name}.{p}": 1 - (1 - module.spec.top_k / module.spec.num_experts) ** tokens
                    for name, module in model.named_modules() if isinstance(module, FusedMoE)
                    for p in ("w13_weight", "w2_weight")}
    total = 0
    for name, param in model.named_parameters():
        if "embed_tokens" in name and not model.config.tie_word_embeddings:
            continue
        total += int(param.numel() * param.element_size() * expert_share.get(name, 1.0))
    return total


def kv_bytes_per_token(model: torch.nn.Module) -> int:
    elem = next(model.parameters()).element_size()
    return sum(elem * math.prod(shape) for m in model.modules() if hasattr(m, "kv_cache_shapes")
               for shape in m.kv_cache_shapes(1, 1))


def print_environment() -> None:
    print(" | ".join(f"{k} {v}" for k, v in environment().items()))
