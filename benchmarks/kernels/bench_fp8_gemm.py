"""FP8 weights (one scale a row) against several rows of x at Llama-3.1-8B's linear layers: the tile kernel
(wick/kernels/fp8_matmul.py, the fp8 bytes read once) against W converted to bf16 then cuBLAS (the layer's path
from DEQUANTIZE_MIN_ROWS rows) and against bf16 weights. Milliseconds for the four layers, each row count;
`--sweep` also times every tile shape of SWEEP with the tile kernel and prints the best.

    python -m benchmarks.kernels.bench_fp8_gemm [--rows 16 32 64 128 256 1024] [--sweep]
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable

import torch
from triton.testing import do_bench

from benchmarks.common import print_environment
from benchmarks.kernels.bench_quant_gemv import LLAMA_8B
from wick.kernels.fp8_matmul import fp8_matmul
from wick.layers.quantization.fp8 import quantize_rows

SWEEP = list(itertools.product([16, 32, 64, 128], [128, 256], [64, 128], [4, 8], [3, 4]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 32, 64, 128, 256, 512, 1024])
    parser.add_argument("--sweep", action="store_true")
    args = parser.parse_args()
    print_environment()
    layers = []
    for _, n, k in LLAMA_8B:
        w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") / k**0.5
        layers.append((w, *quantize_rows(w)))
    print("rows | bf16 ms | fp8 converted + cuBLAS ms | fp8 tile kernel ms | tile / bf16")
    for rows in args.rows:
        xs = [torch.randn(rows, w.shape[1], dtype=torch.bfloat16, device="cuda") for w, _, _ in layers]

        def run(fn: Callable, xs: list[torch.Tensor] = xs) -> float:
            return do_bench(lambda: [fn(x, *layer) for x, layer in zip(xs, layers, strict=True)], warmup=20, rep=200)

        bf16 = run(lambda x, w, q, s: x @ w.t())
        converted = run(lambda x, w, q, s: (x @ q.to(x.dtype).t()).mul_(s.view(-1)))
        tile = run(lambda x, w, q, s: fp8_matmul(x, q, s, (1, q.shape[1])))
        print(f"{rows} | {bf16:.3f} | {converted:.3f} | {tile:.3f} | {tile / bf16:.2f}x")
        if args.sweep:
            timings = {}
            for config in SWEEP:
                try:
                    timings[config] = run(lambda x, w, q, s, c=config: fp8_matmul(x, q, s, (1, q.shape[1]),
                                                                                  tile_config=c))
                except Exception as error:  # a tile too large for the shared memory
                    print(f"  {config}: {type(error).__name__}")
            best = min(timings, key=timings.get)
            print(f"  sweep {rows} rows: best {best} {timings[best]:.3f} ms")


if __name__ == "__main__":
    main()
