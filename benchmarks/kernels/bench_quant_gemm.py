"""GGUF weights against many rows of x (prefill, larger decode batches) at Llama-3.1-8B's linear layers, ms for
the four, each row count: bf16's x @ W^T, W dequantized whole for cuBLAS, and gguf_matmul as the layer runs it
(for Q4_K the tile kernel up to Q4_K_TILE_MAX_ROWS rows). `--sweep` also times every Q4_K tile shape of SWEEP
and prints the best.

    python -m benchmarks.kernels.bench_quant_gemm [--qtype Q4_K] [--rows 16 64 256 2048 8192] [--sweep]
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from triton.testing import do_bench

from benchmarks.common import print_environment
from benchmarks.kernels.bench_quant_gemv import LLAMA_8B
from wick.kernels.gguf_matmul import gguf_matmul

# (BLOCK_M, BLOCK_N, PAIRS, warps, stages)
SWEEP = list(itertools.product([16, 32, 64, 128, 256], [64, 128], [1, 2, 4], [4, 8], [3]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--qtype", default="Q4_K")
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 32, 64, 128, 256, 512, 1024, 2048, 8192])
    parser.add_argument("--sweep", action="store_true")
    args = parser.parse_args()
    print_environment()
    qtype = GGMLQuantizationType[args.qtype]
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    layers = []
    for _, n, k in LLAMA_8B:
        data = torch.randint(0, 256, (n, k // block_size * type_size), dtype=torch.uint8, device="cuda")
        # small float16 scales wherever a block keeps them, so that no decoded value overflows
        blocks = data.view(n, k // block_size, type_size)
        blocks[..., :4] = torch.full((n, k // block_size, 2), 1e-3, dtype=torch.float16,
                                     device="cuda").view(torch.uint8)
        layers.append((n, k, data, torch.randn(n, k, dtype=torch.bfloat16, device="cuda")))
    print(f"{args.qtype}, Llama-3.1-8B's layers: ms for the four")
    print(f"| rows | bf16 | dequantized + cuBLAS | {args.qtype} as the layer runs it | vs bf16 |")
    print("|---|---|---|---|---|")
    for m in args.rows:
        xs = [torch.randn(m, k, dtype=torch.bfloat16, device="cuda") for _, k, _, _ in layers]

        def run(fn: Callable, xs: list[torch.Tensor] = xs) -> float:
            return do_bench(lambda: [fn(x, *layer) for x, layer in zip(xs, layers, strict=True)], warmup=10, rep=100)

        bf16 = run(lambda x, n, k, data, w: x @ w.t())
        dequantized = run(lambda x, n, k, data, w: gguf_matmul(x, data, qtype, (n, k), tile_max_rows=0))
        layer = run(lambda x, n, k, data, w: gguf_matmul(x, data, qtype, (n, k)))
        print(f"| {m} | {bf16:.3f} | {dequantized:.3f} | {layer:.3f} | {bf16 / layer:.2f}x |", flush=True)
        if args.sweep and qtype == GGMLQuantizationType.Q4_K:
            timings = {}
            for config in SWEEP:
                if config[0] > 2 * m:
                    continue
                try:
                    timings[config] = run(lambda x, n, k, data, w, c=config: gguf_matmul(
                        x, data, qtype, (n, k), tile_config=c, tile_max_rows=1 << 62))
                except Exception as error:  # a tile too large for the shared memory or registers
                    print(f"  {config}: {type(error).__name__}")
            ranked = sorted(timings, key=timings.get)
            print(f"  sweep {m} rows: " + ", ".join(f"{c} {timings[c]:.3f}" for c in ranked[:4]), flush=True)


if __name__ == "__main__":
    main()
