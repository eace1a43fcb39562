"""One GGUF linear layer on the CPU, x [rows, columns] @ W^T, by its repacked weight (wick/layers/quantization/
gguf_cpu.py: its int4 or int8 kernel, or for a prompt's rows an Int8Weight's float32 rows) and by the path that
dequantizes the file's blocks in every call: each type's median milliseconds over rounds that alternate the two, and
the bytes each holds (the repacked tensors, the file's blocks).

    python -m benchmarks.cpu_gguf_linear [--types iq4_xs,iq4_nl,q8_0] [--shapes 896x4864 4864x896] [--rows 1]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from statistics import median

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from benchmarks.common import print_environment, random_gguf_blocks
from wick.layers.quantization.gguf import GGUFWeight, gguf_linear


def _milliseconds(x: torch.Tensor, weight: GGUFWeight) -> float:
    start = time.perf_counter()
    gguf_linear(x, weight)
    return (time.perf_counter() - start) * 1e3


def _bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--types", default="iq4_xs,iq4_nl,q8_0,q6_k,q4_k")
    parser.add_argument("--shapes", nargs="+", default=["896x4864", "4864x896", "2048x8192"],
                        help="ROWSxCOLUMNS of W (default: Qwen2.5-0.5B's down and up projections, a 2,048-wide "
                             "model's)")
    parser.add_argument("--rows", type=int, default=1, help="rows of x (1: a decode step of one request)")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    print_environment()
    print(f"torch threads {torch.get_num_threads()} | rows of x {args.rows} | {args.repeats} rounds, medians")
    print("| type | W | repacked ms | dequantizing ms | speedup | repacked MiB | file MiB |")
    print("|---|---|---|---|---|---|---|")
    for name in args.types.split(","):
        qtype = GGMLQuantizationType[name.upper()]
        for shape in args.shapes:
            rows, columns = map(int, shape.split("x"))
            if columns % GGML_QUANT_SIZES[qtype][0]:
                print(f"| {name} | {rows} x {columns} | columns not whole blocks of {GGML_QUANT_SIZES[qtype][0]} |")
                continue
            torch.manual_seed(0)
            plain = GGUFWeight(random_gguf_blocks(qtype, rows, columns, device="cpu"), qtype, (rows, columns))
            kernel = plain.with_cpu_kernel()
            if kernel.cpu_kernel is None:
                raise SystemExit(f"{name} {shape}: no CPU kernel takes this weight")
            plain = replace(plain, cpu_kernel=None)
            x = torch.randn(args.rows, columns)
            for weight in (kernel, plain):
                gguf_linear(x, weight)
            times: dict[str, list[float]] = {"kernel": [], "plain": []}
            for _ in range(args.repeats):
                times["kernel"].append(_milliseconds(x, kernel))
                times["plain"].append(_milliseconds(x, plain))
            fast, slow = median(times["kernel"]), median(times["plain"])
            print(f"| {name} | {rows} x {columns} | {fast:.2f} | {slow:.2f} | {slow / fast:.1f}x | "
                  f"{_bytes(kernel.held_tensors()) / 2**20:.1f} | {_bytes(plain.held_tensors()) / 2**20:.1f} |")


if __name__ == "__main__":
    main()
