"""What programmatic dependent launch saves between kernels inside a CUDA graph.

Two chains, each captured once without and once with PDL: many tiny kernels (the boundary alone) and
GEMVs over distinct weights (a decode layer's shape). With PDL each kernel lets its successor launch at
its start and waits for its predecessor before it reads x; `prefetch` also loads its first weight tile
before that wait.
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl


@triton.jit
def _tiny_kernel(x_ptr, y_ptr, n, MODE: tl.constexpr, BLOCK: tl.constexpr):
    if MODE > 0:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, x + 1, mask=offs < n)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, y_ptr, K, MODE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + rows[:, None] * K + cols[None, :]
    if MODE > 0:
        tl.extra.cuda.gdc_launch_dependents()
    if MODE == 2:
        w = tl.load(w_ptrs).to(tl.float32)
    if MODE > 0:
        tl.extra.cuda.gdc_wait()
    if MODE != 2:
        w = tl.load(w_ptrs).to(tl.float32)
    acc = tl.zeros((BLOCK_N,), tl.float32)
    for k in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + k + cols).to(tl.float32)
        acc += tl.sum(w * x[None, :], 1)
        if k + BLOCK_K < K:
            w = tl.load(w_ptrs + k + BLOCK_K).to(tl.float32)
    tl.store(y_ptr + rows, acc.to(y_ptr.dtype.element_ty))


def _graph_us(launch, replays: int) -> float:
    launch()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / replays


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tiny", type=int, default=400, help="tiny kernels in the first chain")
    parser.add_argument("--gemvs", type=int, default=64, help="GEMVs in the second chain")
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--replays", type=int, default=50)
    args = parser.parse_args()
    modes = {"off": 0, "pdl": 1, "pdl+prefetch": 2}

    bufs = [torch.zeros(4096, device="cuda") for _ in range(args.tiny + 1)]
    for name, mode in modes.items():
        if mode == 2:
            continue

        def tiny(mode=mode) -> None:
            for i in range(args.tiny):
                _tiny_kernel[(4,)](bufs[i], bufs[i + 1], 4096, MODE=mode, BLOCK=1024, launch_pdl=mode > 0)

        us = _graph_us(tiny, args.replays)
        assert bufs[-1][0].item() == args.tiny
        print(f"tiny x{args.tiny} {name}: {us:.1f} us a replay, {us / args.tiny:.2f} us a kernel", flush=True)

    d = args.dim
    weights = [torch.randn(d, d, device="cuda", dtype=torch.bfloat16) / d**0.5 for _ in range(args.gemvs)]
    xs = [torch.randn(d, device="cuda", dtype=torch.bfloat16) for _ in range(args.gemvs + 1)]
    for block_n, warps in ((16, 4), (8, 2)):
        ref = None
        for name, mode in modes.items():
            def chain(mode=mode, block_n=block_n, warps=warps) -> None:
                for i, w in enumerate(weights):
                    _gemv_kernel[(d // block_n,)](xs[i], w, xs[i + 1], d, MODE=mode, BLOCK_N=block_n,
                                                  BLOCK_K=256, num_warps=warps, launch_pdl=mode > 0)

            us = _graph_us(chain, args.replays)
            out = xs[-1].float().clone()
            ref = out if ref is None else ref
            same = torch.equal(out, ref)
            gbs = args.gemvs * d * d * 2 / us / 1e3
            print(f"gemv {d}x{d} x{args.gemvs} rows {block_n} warps {warps} {name}: {us:.1f} us a replay, "
                  f"{us / args.gemvs:.2f} us a GEMV, {gbs:.0f} GB/s, output equal to off: {same}", flush=True)


if __name__ == "__main__":
    main()
