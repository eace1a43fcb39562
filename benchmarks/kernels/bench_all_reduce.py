"""Times the tensor-parallel all-reduce on two GPUs (bf16, in place): NCCL against the one-shot kernel over
symmetric memory (wick/distributed/symm_all_reduce.py), for tensors of 8 KiB to 1 MiB (a decode step's
activations at 1 to 128 tokens of 4096 features); then, as a decoder layer runs it, the all-reduce followed by
the residual add and RMSNorm (kernels/rms_norm.py) against the kernel that does all three
(kernels/all_reduce_rms_norm.py). Microseconds per call, each inside a CUDA graph of `--calls` calls in a row,
as decode runs them.

    python -m benchmarks.kernels.bench_all_reduce [--calls 32 --replays 50]
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.common import print_environment
from wick.distributed.parallel_state import init_distributed
from wick.distributed.symm_all_reduce import SymmAllReduce, symm_all_reduce
from wick.kernels.rms_norm import fused_add_rms_norm

SIZES_KIB = [8, 16, 32, 64, 128, 256, 512, 1024]
HIDDEN = 4096


def _graph_us(all_reduce: Callable[[torch.Tensor], object], x: torch.Tensor, calls: int, replays: int) -> float:
    all_reduce(x)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            all_reduce(x)
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (replays * calls)


def _run(rank: int, init_method: str, calls: int, replays: int) -> None:
    os.environ["WICK_FUSED_ALL_REDUCE_NORM"] = "1"
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    init_distributed(rank, 2, 2, init_method, device)
    one_shot: SymmAllReduce | None = symm_all_reduce()
    if rank == 0:
        print_environment()
        if one_shot is None:
            print("no symmetric memory here: NCCL only (see the log)")
        print(f"{'KiB':>6} {'NCCL us':>9} {'one-shot us':>12} {'speed-up':>9}")
    for kib in SIZES_KIB:
        x = torch.zeros(kib * 1024 // 2, dtype=torch.bfloat16, device=device)
        nccl = _graph_us(dist.all_reduce, x, calls, replays)
        fast = float("nan") if one_shot is None else _graph_us(one_shot, x, calls, replays)
        if rank == 0:
            print(f"{kib:>6} {nccl:>9.2f} {fast:>12.2f} {nccl / fast:>8.2f}x")
    if one_shot is None:
        return
    if rank == 0:
        print(f"\nall-reduce, residual add and RMSNorm of rows of {HIDDEN}:")
        print(f"{'rows':>6} {'one-shot + norm us':>19} {'fused us':>9} {'speed-up':>9}")
    weight = torch.ones(HIDDEN, dtype=torch.bfloat16, device=device)
    for kib in SIZES_KIB:
        x = torch.zeros(kib * 1024 // 2 // HIDDEN, HIDDEN, dtype=torch.bfloat16, device=device)
        residual = torch.zeros_like(x)
        apart = _graph_us(lambda x, r=residual: fused_add_rms_norm(one_shot(x), r, weight, 1e-6), x, calls, replays)
        fused = _graph_us(lambda x, r=residual: one_shot.add_rms_norm(x, r, weight, 1e-6), x, calls, replays)
        if rank == 0:
            print(f"{x.shape[0]:>6} {apart:>19.2f} {fused:>9.2f} {apart / fused:>8.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=32)
    parser.add_argument("--replays", type=int, default=50)
    args = parser.parse_args()
    if torch.cuda.device_count() < 2:
        raise SystemExit("needs two CUDA devices")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_run, args=(f"tcp://127.0.0.1:{port}", args.calls, args.replays), nprocs=2, join=True)


if __name__ == "__main__":
    main()
