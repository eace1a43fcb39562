"""One CPU decode step's SDPA over a paged KV cache, by the cache's memory layout and dtype: token-major
([blocks, block_size, Hkv, D], positions Hkv * D apart for one head) against head-major (each head's
positions contiguous, the torch backend's), float32 against bfloat16. Every layer has its own cache, so that
together they outgrow the CPU's caches as a model's do; the layouts are timed in turn, round by round, and
the medians printed (µs a layer).

    python -m benchmarks.cpu_kv_layout [--positions 2048 --layers 30 --rounds 5]   # the default model's shape
"""

from __future__ import annotations

import argparse
import time
from statistics import median

import torch
import torch.nn.functional as F

from benchmarks.common import print_environment


def caches(layout: str, layers: int, positions: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
           block_size: int = 16) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's keys and values as the attention reads them: [Hkv, positions, D] views of its pages."""
    blocks = positions // block_size
    if layout == "token-major":
        pages = [torch.randn(2, blocks, block_size, kv_heads, head_dim, dtype=dtype) for _ in range(layers)]
        return [(p[0].flatten(0, 1).transpose(0, 1), p[1].flatten(0, 1).transpose(0, 1)) for p in pages]
    pages = [torch.randn(2, kv_heads, blocks, block_size, head_dim, dtype=dtype) for _ in range(layers)]
    return [(p[0].flatten(1, 2), p[1].flatten(1, 2)) for p in pages]


def step_us(kv: list[tuple[torch.Tensor, torch.Tensor]], q: torch.Tensor, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        for k, v in kv:
            F.scaled_dot_product_attention(q, k[None], v[None], enable_gqa=True)
    return (time.perf_counter() - start) / steps / len(kv) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--positions", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    print_environment()
    variants = [(layout, dtype) for dtype in (torch.float32, torch.bfloat16)
                for layout in ("token-major", "head-major")]
    kv = {v: caches(v[0], args.layers, args.positions, args.kv_heads, args.head_dim, v[1]) for v in variants}
    queries = {dtype: torch.randn(1, args.heads, 1, args.head_dim, dtype=dtype) for _, dtype in variants}
    timings: dict[tuple[str, torch.dtype], list[float]] = {v: [] for v in variants}
    for _ in range(args.rounds):
        for variant in variants:
            step_us(kv[variant], queries[variant[1]], 1)  # warm-up
            timings[variant].append(step_us(kv[variant], queries[variant[1]], args.steps))
    print(f"{args.layers} layers x {args.positions} positions, {args.heads} heads over {args.kv_heads} KV heads of "
          f"{args.head_dim}; {torch.get_num_threads()} threads; median of {args.rounds} rounds, µs a layer:")
    for (layout, dtype), values in timings.items():
        print(f"  {layout:>11} {str(dtype).removeprefix('torch.'):>8}: {median(values):7.0f} "
              f"(rounds {min(values):.0f}-{max(values):.0f})")


if __name__ == "__main__":
    main()
