"""Bidirectional attention over a packed batch of whole sequences (an encoder's step), as the embedding models
run it: the padded grid with a key mask through SDPA (each backend torch offers) against varlen attention on the
packed tokens (no padding). Milliseconds per call on the host's clock with the device synchronised (so an SDPA
backend that plans on the host is charged for it), the step's shapes drawn as the embedding benchmark's
(sequence lengths uniform in [min, max]).

    python -m benchmarks.kernels.bench_encoder_attention [--num-seqs 240 --heads 12 --head-dim 32]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.common import print_environment
from wick.layers.attention.encoder import PaddedLayout, varlen_attention


def timed_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-seqs", type=int, default=240)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--min-len", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    print_environment()
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(args.min_len, args.max_len + 1, (args.num_seqs,), generator=gen)
    query_start = [0, *torch.cumsum(lengths, 0).tolist()]
    num_tokens = query_start[-1]
    q, k, v = torch.randn(3, num_tokens, args.heads, args.head_dim, dtype=getattr(torch, args.dtype),
                          device="cuda").unbind(0)
    scale = args.head_dim**-0.5
    print(f"{args.num_seqs} sequences, {num_tokens} tokens (longest {int(lengths.max())}), {args.heads} heads of "
          f"{args.head_dim}, {args.dtype}; median of {args.repeats} calls, host clock, synchronised")
    reference = None
    for name, backends in (("SDPA, torch's choice", None), ("SDPA, cuDNN", [SDPBackend.CUDNN_ATTENTION]),
                           ("SDPA, memory-efficient", [SDPBackend.EFFICIENT_ATTENTION]),
                           ("SDPA, math", [SDPBackend.MATH])):
        def padded(backends=backends) -> torch.Tensor:
            layout = PaddedLayout.build(query_start, q.device)
            if backends is None:
                return layout.attend(q, k, v, scale)
            with sdpa_kernel(backends):
                return layout.attend(q, k, v, scale)
        try:
            ms = timed_ms(padded, args.repeats)
        except RuntimeError as error:
            print(f"  padded grid, {name}: not available ({str(error).splitlines()[0][:80]})")
            continue
        reference = padded() if reference is None else reference
        print(f"  padded grid, {name}: {ms:.3f} ms")
    cu = torch.tensor(query_start, dtype=torch.int32, device="cuda")
    max_len = int(lengths.max())
    ms = timed_ms(lambda: varlen_attention(q, k, v, cu, max_len, scale), args.repeats)
    out = varlen_attention(q, k, v, cu, max_len, scale)
    diff = (out.float() - reference.float()).abs().max().item() if reference is not None else float("nan")
    print(f"  varlen (packed tokens): {ms:.3f} ms; max |difference| from the padded grid {diff:.2e}")


if __name__ == "__main__":
    main()
