"""GGUF weights against many rows of x (prefill, larger decode batches) at Llama-3.1-8B's linear layers, ms for
the four, each row count: bf16's x @ W^T, W dequantized whole for cuBLAS, the tile kernel (forced), and gguf_matmul
as the layer runs it (the tile kernel up to the type's TILE_MAX_ROWS rows). `--sweep` also times every tile shape
of SWEEP (forced, for every row count) and prints the best. `--qtype GPTQ`: 4-bit weights in groups of 128
(GPTQ/AWQ), the W4A16 tile kernel (wna16_matmul) against W dequantized (one kernel) for cuBLAS, as the layer picks
them (DEQUANTIZE_MIN_ROWS).

    python -m benchmarks.kernels.bench_quant_gemm [--qtype Q4_K|Q3_K|IQ4_XS|...|GPTQ] [--rows 16 64 256] [--sweep]
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable

import torch
from gguf import GGMLQuantizationType
from triton.testing import do_bench

from benchmarks.common import print_environment, random_gguf_blocks
from benchmarks.kernels.bench_quant_gemv import LLAMA_8B
from wick.kernels.gguf_matmul import gguf_matmul
from wick.kernels.gguf_tiles import HALF_BLOCK_TYPES
from wick.kernels.wna16_matmul import wna16_dequantize_triton, wna16_matmul
from wick.layers.quantization.base import DEQUANTIZE_MIN_ROWS
from wick.loader.gguf_dequant import BLOCK_TYPES

# (BLOCK_M, BLOCK_N, K_STEP, warps, stages); HALF_BLOCK_TYPES take K_STEP of 128 and 256 only
SWEEP = list(itertools.product([16, 32, 64, 128, 256], [64, 128], [64, 128, 256], [4, 8], [3]))
# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) of the W4A16 tile kernel
WNA16_SWEEP = list(itertools.product([16, 32, 64, 128], [64, 128], [64, 128], [4, 8], [3]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--qtype", default="Q4_K", choices=[t.name for t in sorted(BLOCK_TYPES)] + ["GPTQ"])
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 32, 64, 128, 256, 512, 1024, 2048, 8192])
    parser.add_argument("--sweep", action="store_true")
    args = parser.parse_args()
    print_environment()
    if args.qtype == "GPTQ":
        gptq(args)
        return
    qtype = GGMLQuantizationType[args.qtype]
    layers = [(n, k, random_gguf_blocks(qtype, n, k), torch.randn(n, k, dtype=torch.bfloat16, device="cuda"))
              for _, n, k in LLAMA_8B]
    print(f"{args.qtype}, Llama-3.1-8B's layers: ms for the four")
    print(f"| rows | bf16 | dequantized + cuBLAS | tiles | {args.qtype} as the layer runs it | vs bf16 |")
    print("|---|---|---|---|---|---|")
    for m in args.rows:
        xs = [torch.randn(m, k, dtype=torch.bfloat16, device="cuda") for _, k, _, _ in layers]

        def run(fn: Callable, xs: list[torch.Tensor] = xs) -> float:
            return do_bench(lambda: [fn(x, *layer) for x, layer in zip(xs, layers, strict=True)], warmup=10, rep=100)

        bf16 = run(lambda x, n, k, data, w: x @ w.t())
        dequantized = run(lambda x, n, k, data, w: gguf_matmul(x, data, qtype, (n, k), tile_max_rows=0))
        tiles = run(lambda x, n, k, data, w: gguf_matmul(x, data, qtype, (n, k), tile_max_rows=1 << 62))
        layer = run(lambda x, n, k, data, w: gguf_matmul(x, data, qtype, (n, k)))
        print(f"| {m} | {bf16:.3f} | {dequantized:.3f} | {tiles:.3f} | {layer:.3f} | {bf16 / layer:.2f}x |",
              flush=True)
        if args.sweep:
            timings = {}
            for config in SWEEP:
                if config[0] > 2 * m or (qtype in HALF_BLOCK_TYPES and config[2] < 128):
                    continue
                try:
                    timings[config] = run(lambda x, n, k, data, w, c=config: gguf_matmul(
                        x, data, qtype, (n, k), tile_config=c, tile_max_rows=1 << 62))
                except Exception as error:  # a tile too large for the shared memory or registers
                    print(f"  {config}: {type(error).__name__}")
            ranked = sorted(timings, key=timings.get)
            print(f"  sweep {m} rows: " + ", ".join(f"{c} {timings[c]:.3f}" for c in ranked[:4]), flush=True)


def gptq(args: argparse.Namespace) -> None:
    """4-bit GPTQ weights in groups of 128 at Llama-3.1-8B's layers: bf16, dequantized + cuBLAS, the tile kernel, and
    as the layer runs them."""
    layers = []
    for _, n, k in LLAMA_8B:
        qweight = torch.randint(-(1 << 31), 1 << 31, (k // 8, n), dtype=torch.int64, device="cuda").to(torch.int32)
        scales = torch.full((k // 128, n), 1e-3, dtype=torch.bfloat16, device="cuda")
        g_idx = (torch.arange(k, device="cuda") // 128).to(torch.int32)
        layers.append((k, (qweight, scales, torch.full_like(scales, 8.0), g_idx, 4),
                       torch.randn(k, n, dtype=torch.bfloat16, device="cuda")))
    print("GPTQ 4-bit g128, Llama-3.1-8B's layers: ms for the four")
    print("| rows | bf16 | dequantized + cuBLAS | tile kernel | as the layer runs it | vs bf16 |")
    print("|---|---|---|---|---|---|")
    for m in args.rows:
        xs = [torch.randn(m, k, dtype=torch.bfloat16, device="cuda") for k, _, _ in layers]

        def run(fn: Callable, xs: list[torch.Tensor] = xs) -> float:
            return do_bench(lambda: [fn(x, weights, w) for x, (_, weights, w) in zip(xs, layers, strict=True)],
                            warmup=10, rep=100)

        def dequantized(x: torch.Tensor, weights: tuple, w: torch.Tensor) -> torch.Tensor:
            return x @ wna16_dequantize_triton(*weights)

        bf16 = run(lambda x, weights, w: x @ w)
        decoded = run(dequantized)
        tiles = run(lambda x, weights, w: wna16_matmul(x, *weights, group=128))
        layer = tiles if m < DEQUANTIZE_MIN_ROWS else decoded
        print(f"| {m} | {bf16:.3f} | {decoded:.3f} | {tiles:.3f} | {layer:.3f} | {bf16 / layer:.2f}x |", flush=True)
        if args.sweep:
            timings = {}
            for config in WNA16_SWEEP:
                if config[0] <= 2 * m:
                    timings[config] = run(lambda x, weights, w, c=config: wna16_matmul(x, *weights, group=128,
                                                                                        tile_config=c))
            ranked = sorted(timings, key=timings.get)
            print(f"  sweep {m} rows: " + ", ".join(f"{c} {timings[c]:.3f}" for c in ranked[:4]), flush=True)


if __name__ == "__main__":
    main()
