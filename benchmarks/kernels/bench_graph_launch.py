"""What launching a captured decode graph costs the host, against the graph's time on the GPU: the
host time of one `replay()` on an idle GPU, of one issued behind others (the launch queue busy), and
the GPU time per replay of back-to-back replays, each on the inputs it was captured on (one token of context a
row)."""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.common import print_environment
from wick import LLM


def _host_replay_us(graph: torch.cuda.CUDAGraph, iters: int, idle: bool) -> float:
    times = []
    for _ in range(iters):
        if idle:
            torch.cuda.synchronize()
        start = time.perf_counter()
        graph.replay()
        times.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def _gpu_replay_us(graph: torch.cuda.CUDAGraph, iters: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="qwen3-0.6b")
    parser.add_argument("--attention-backend", default="triton")
    parser.add_argument("--quantization", "-q", default=None)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args()
    print_environment()
    llm = LLM(args.model, load_format="dummy", max_model_len=1024, max_num_seqs=max(args.batch_sizes),
              attention_backend=args.attention_backend, quantization=args.quantization)
    graphs = llm.core.executor.worker.runner.step_graphs
    assert graphs is not None, "no CUDA graphs were captured"
    print(f"{args.model}, q={args.quantization}: replay of one decode graph, median of {args.iters}")
    print("| batch | host, GPU idle (us) | host, GPU busy (us) | GPU per replay (us) |")
    print("|---|---|---|---|")
    for bs in args.batch_sizes:
        size = graphs.batch_size(bs)
        graph = graphs.graphs[size, size]
        # the inputs it was captured on: other graphs' inputs share the buffers
        graphs.buffers.fill(size, size, graphs.max_model_len)
        _gpu_replay_us(graph, 10)
        idle = _host_replay_us(graph, args.iters, idle=True)
        busy = _host_replay_us(graph, args.iters, idle=False)
        gpu = _gpu_replay_us(graph, args.iters)
        print(f"| {bs} | {idle:,.1f} | {busy:,.1f} | {gpu:,.1f} |")


if __name__ == "__main__":
    main()
