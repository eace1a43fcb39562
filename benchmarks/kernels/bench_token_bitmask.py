"""Times applying grammar masks on CUDA: the torch path (unpack every bit, then masked_fill) against the Triton
kernel (which writes -inf in place; timed with the clone the sampler makes before it), at 1 and 256 constrained
rows. Prints microseconds.

    python -m benchmarks.kernels.bench_token_bitmask [--vocab-size 151936]
"""

from __future__ import annotations

import argparse

import torch
from triton.testing import do_bench

from benchmarks.common import print_environment
from wick.layers.sampler import apply_token_bitmask, apply_token_bitmask_torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab-size", type=int, default=151936)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_token_bitmask needs a CUDA device")
    print_environment()
    print(f"vocab {args.vocab_size}, float32 logits, batch 256")
    print(f"{'rows':>6} {'torch us':>10} {'kernel us':>10} {'speed-up':>9}")
    generator = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(256, args.vocab_size, device="cuda", generator=generator)
    words = -(-args.vocab_size // 32)
    for num_rows in (1, 256):
        rows = torch.arange(num_rows, device="cuda")
        bitmask = torch.randint(-2**31, 2**31, (num_rows, words), device="cuda", generator=generator,
                                dtype=torch.int64).to(torch.int32)
        inputs = (logits, rows, bitmask)
        torch_us = do_bench(lambda i=inputs: apply_token_bitmask_torch(*i), warmup=25, rep=200) * 1e3
        kernel_us = do_bench(lambda i=inputs: apply_token_bitmask(*i), warmup=25, rep=200) * 1e3
        print(f"{num_rows:>6} {torch_us:>10.1f} {kernel_us:>10.1f} {torch_us / kernel_us:>8.1f}x")


if __name__ == "__main__":
    main()
