"""Times the sampler's draw on CUDA from bf16 logits, GPU time only (each call replayed from a CUDA graph): the
fused kernel against what the engine ran before it (logits to float32, divided by the temperature, softmax, the
race over the probabilities; for greedy rows torch's argmax), at batch 1 and 256, every row random (temperature
0.6) or greedy. Prints microseconds and the kernel's read bandwidth over the logits; `--sweep` times the kernel's
configurations (tokens a step, programs aimed at, warps).

    python -m benchmarks.kernels.bench_sampling [--vocab-size 151936] [--sweep]
"""

from __future__ import annotations

import argparse
import functools
import itertools
from collections.abc import Callable

import torch
from triton.testing import do_bench_cudagraph

from benchmarks.common import print_environment
from wick.kernels import sampling
from wick.kernels.sampling import exponential_race
from wick.layers.sampler import random_exponentials


def time_us(fn: Callable[[], torch.Tensor]) -> float:
    fn()
    return do_bench_cudagraph(fn, rep=100) * 1e3


def softmax_race(logits: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor,
                 steps: torch.Tensor) -> torch.Tensor:
    """The random rows' draw before the fused kernel, in the same ops (the race over the probabilities as torch ops
    rather than the old kernel, which no longer exists: this column is an upper bound on what it cost)."""
    probs = (logits.float() / temperature[:, None]).softmax(-1)
    return (probs / random_exponentials(seeds, steps, logits.shape[-1])).argmax(-1)


def argmax(logits: torch.Tensor) -> torch.Tensor:
    return logits.float().argmax(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab-size", type=int, default=151936)
    parser.add_argument("--sweep", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_sampling needs a CUDA device")
    print_environment()
    default = (sampling._BLOCK, sampling._TARGET_PROGRAMS, sampling._NUM_WARPS)
    print(f"vocab {args.vocab_size}, bf16 logits, kernel config {default}")
    print(f"{'batch':>6} {'rows':>7} {'before us':>10} {'kernel us':>10} {'kernel GB/s':>12}")
    generator = torch.Generator(device="cuda").manual_seed(0)
    for batch in (1, 256):
        logits = torch.randn(batch, args.vocab_size, device="cuda", generator=generator).bfloat16()
        seeds = torch.randint(-2**63, 2**63 - 1, (batch,), device="cuda", generator=generator)
        steps = torch.randint(0, 4096, (batch,), device="cuda", generator=generator)
        for rows, value in (("random", 0.6), ("greedy", 0.0)):
            inputs = (logits, torch.full((batch,), value, device="cuda"), seeds, steps)
            before = functools.partial(softmax_race, *inputs) if value else functools.partial(argmax, logits)
            before_us = time_us(before)
            configs = itertools.product((1024, 2048, 4096), (1024, 2048, 4096), (4, 8)) if args.sweep else [default]
            for config in configs:
                kernel_us = time_us(functools.partial(exponential_race, *inputs, config=config))
                gbs = logits.numel() * logits.element_size() / 1e3 / kernel_us
                label = f" {config}" if args.sweep else ""
                print(f"{batch:>6} {rows:>7} {before_us:>10.1f} {kernel_us:>10.1f} {gbs:>12.0f}{label}")

if __name__ == "__main__":
    main()
