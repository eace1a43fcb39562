"""Times the sampler's seeded exponential race on CUDA: the torch path (hash, exponentials and argmax as
separate int64/float32 ops over [B, V]) against the fused Triton kernel, at batch 1 and 256. Prints
microseconds and the kernel's read bandwidth over the probabilities.

    python -m benchmarks.kernels.bench_sampling [--vocab-size 151936]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from triton.testing import do_bench

from benchmarks.common import print_environment
from wick.kernels.sampling import exponential_race, exponential_race_ref


def time_us(race: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> float:
    return do_bench(lambda: race(*inputs), warmup=25, rep=200) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab-size", type=int, default=151936)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_sampling needs a CUDA device")
    print_environment()
    print(f"vocab {args.vocab_size}, float32 probabilities")
    print(f"{'batch':>6} {'torch us':>10} {'kernel us':>10} {'speed-up':>9} {'kernel GB/s':>12}")
    generator = torch.Generator(device="cuda").manual_seed(0)
    for batch in (1, 256):
        logits = torch.randn(batch, args.vocab_size, device="cuda", generator=generator)
        probs = logits.softmax(-1)
        seeds = torch.randint(-2**63, 2**63 - 1, (batch,), device="cuda", generator=generator)
        steps = torch.randint(0, 4096, (batch,), device="cuda", generator=generator)
        torch_us = time_us(exponential_race_ref, probs, seeds, steps)
        kernel_us = time_us(exponential_race, probs, seeds, steps)
        gbs = probs.numel() * probs.element_size() / 1e3 / kernel_us
        print(f"{batch:>6} {torch_us:>10.1f} {kernel_us:>10.1f} {torch_us / kernel_us:>8.1f}x {gbs:>12.0f}")


if __name__ == "__main__":
    main()
