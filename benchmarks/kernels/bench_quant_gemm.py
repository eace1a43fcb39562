"""GGUF weights against many rows of x (prefill, larger decode batches): gguf_matmul (W dequantized whole for
cuBLAS) against bf16's x @ W^T at Llama-3.1-8B's linear layers, for each row count.

    python -m benchmarks.kernels.bench_quant_gemm [--qtype Q4_K] [--rows 16 64 256 2048 8192]
"""

from __future__ import annotations

import argparse
from functools import partial

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from triton.testing import do_bench

from benchmarks.common import print_environment
from benchmarks.kernels.bench_quant_gemv import LLAMA_8B
from wick.kernels.gguf_matmul import gguf_matmul


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--qtype", default="Q4_K")
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 32, 64, 128, 256, 1024, 8192])
    args = parser.parse_args()
    print_environment()
    qtype = GGMLQuantizationType[args.qtype]
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    layers = []
    for name, n, k in LLAMA_8B:
        data = torch.randint(0, 256, (n, k // block_size * type_size), dtype=torch.uint8, device="cuda")
        # small float16 scales wherever a block keeps them, so that no decoded value overflows
        blocks = data.view(n, k // block_size, type_size)
        blocks[..., :4] = torch.full((n, k // block_size, 2), 1e-3, dtype=torch.float16,
                                     device="cuda").view(torch.uint8)
        layers.append((name, n, k, data, torch.randn(n, k, dtype=torch.bfloat16, device="cuda")))
    print(f"{args.qtype}, Llama-3.1-8B's layers: ms for the four")
    print(f"| rows | bf16 | {args.qtype} | vs bf16 |")
    print("|---|---|---|---|")
    for m in args.rows:
        bf16 = quantized = 0.0
        for _, n, k, data, weight in layers:
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            bf16 += do_bench(partial(torch.matmul, x, weight.t()), warmup=5, rep=40)
            quantized += do_bench(partial(gguf_matmul, x, data, qtype, (n, k)), warmup=5, rep=40)
        print(f"| {m} | {bf16:.3f} | {quantized:.3f} | {bf16 / quantized:.2f}x |")


if __name__ == "__main__":
    main()
