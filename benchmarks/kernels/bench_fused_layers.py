"""Times the layers' torch ops against their fused Triton kernels on CUDA, at T=1 (a decode step of one
request) and T=256: RMSNorm, the residual add + RMSNorm, Qwen3's per-head q/k norms, SiLU-and-mul and
rotary. Prints microseconds per call inside a CUDA graph (as decode runs them) and eagerly.

    python -m benchmarks.kernels.bench_fused_layers [--hidden-size 1024 --num-heads 16 --num-kv-heads 8 ...]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from triton.testing import do_bench, do_bench_cudagraph

from benchmarks.common import print_environment
from wick.kernels.activation import silu_and_mul, silu_and_mul_ref
from wick.kernels.rms_norm import fused_add_rms_norm, fused_add_rms_norm_ref, rms_norm, rms_norm_ref
from wick.kernels.rotary import rotary_embedding, rotary_embedding_ref
from wick.layers.rotary import get_rope

EPS = 1e-6


def cases(num_tokens: int, args: argparse.Namespace) -> dict[str, tuple[Callable[[], object], Callable[[], object]]]:
    """name -> (torch ops, fused kernel), each a call on fixed inputs of the model's shapes."""
    dtype = getattr(torch, args.dtype)
    randn = lambda *shape: torch.randn(*shape, dtype=dtype, device="cuda")
    hidden, head_dim = args.hidden_size, args.head_dim
    x, residual = randn(num_tokens, hidden), randn(num_tokens, hidden)
    weight, head_weight = randn(hidden), randn(head_dim)
    q_size, kv_size = args.num_heads * head_dim, args.num_kv_heads * head_dim
    q, k, _ = randn(num_tokens, q_size + 2 * kv_size).split([q_size, kv_size, kv_size], dim=-1)
    q_heads, k_heads = q.reshape(-1, args.num_heads, head_dim), k.reshape(-1, args.num_kv_heads, head_dim)
    gate_up = randn(num_tokens, 2 * args.intermediate_size)
    cache = get_rope(head_dim, 40960, 1000000.0).cos_sin_cache.cuda()
    positions = torch.randint(0, cache.shape[0], (num_tokens,), device="cuda")
    return {
        "rms_norm": (lambda: rms_norm_ref(x, weight, EPS), lambda: rms_norm(x, weight, EPS)),
        "add + rms_norm": (lambda: fused_add_rms_norm_ref(x, residual, weight, EPS),
                           lambda: fused_add_rms_norm(x, residual, weight, EPS)),
        "q_norm + k_norm": (
            lambda: (rms_norm_ref(q_heads, head_weight, EPS), rms_norm_ref(k_heads, head_weight, EPS)),
            lambda: (rms_norm(q_heads, head_weight, EPS), rms_norm(k_heads, head_weight, EPS))),
        "silu_and_mul": (lambda: silu_and_mul_ref(gate_up), lambda: silu_and_mul(gate_up)),
        "rotary": (lambda: rotary_embedding_ref(positions, q, k, cache),
                   lambda: rotary_embedding(positions, q, k, cache)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden-size", type=int, default=1024)
    parser.add_argument("--intermediate-size", type=int, default=3072)
    parser.add_argument("--num-heads", type=int, default=16)
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_fused_layers needs a CUDA device")
    print_environment()
    print(f"hidden {args.hidden_size}, intermediate {args.intermediate_size}, heads {args.num_heads}/"
          f"{args.num_kv_heads}, head_dim {args.head_dim}, {args.dtype}; microseconds per call")
    print(f"{'op':>16} {'T':>5} {'graph torch':>12} {'graph fused':>12} {'x':>6} {'eager torch':>12} "
          f"{'eager fused':>12} {'x':>6}")
    for num_tokens in (1, 256):
        for name, (torch_ops, fused) in cases(num_tokens, args).items():
            graph = [do_bench_cudagraph(fn, rep=100) * 1e3 for fn in (torch_ops, fused)]
            eager = [do_bench(fn, warmup=25, rep=100) * 1e3 for fn in (torch_ops, fused)]
            print(f"{name:>16} {num_tokens:>5} {graph[0]:>12.2f} {graph[1]:>12.2f} {graph[0] / graph[1]:>6.1f} "
                  f"{eager[0]:>12.2f} {eager[1]:>12.2f} {eager[0] / eager[1]:>6.1f}")


if __name__ == "__main__":
    main()
