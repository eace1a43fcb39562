"""Times our paged attention kernel on CUDA: decode (batch 1/64/256 x context 1024/8192) and an 8192-token
prefill. Prints microseconds and the achieved K/V read bandwidth (bytes of the K/V the batch attends
to / time); decode also shows the split-KV choice against no split. `--splits-sweep`: one request's decode
at short contexts, every split count, timed in CUDA graphs (what the split choice's MIN_SPLIT_TOKENS rests on).
`--config-sweep`: decode at batch 64 and 256, every (keys a tile, warps, pipeline stages), timed in CUDA graphs.

    python -m benchmarks.kernels.bench_paged_attention [--num-heads 32 --num-kv-heads 8 --head-dim 128]
"""

from __future__ import annotations

import argparse

import torch
from triton.runtime.errors import OutOfResources
from triton.testing import do_bench, do_bench_cudagraph

from benchmarks.common import print_environment
from wick.kernels.paged_attention import choose_num_splits, paged_attention

BLOCK_SIZE = 16


def make_inputs(query_lens: list[int], seq_lens: list[int], args: argparse.Namespace) -> tuple[torch.Tensor, ...]:
    dtype = getattr(torch, args.dtype)
    pages_per_req = -(-max(seq_lens) // BLOCK_SIZE)
    num_pages = pages_per_req * len(seq_lens)
    caches = torch.randn(2, num_pages, BLOCK_SIZE, args.num_kv_heads, args.head_dim, dtype=dtype, device="cuda")
    block_tables = torch.randperm(num_pages, device="cuda").int().view(len(seq_lens), pages_per_req)
    q = torch.randn(sum(query_lens), args.num_heads, args.head_dim, dtype=dtype, device="cuda")
    starts = torch.tensor([0, *query_lens], device="cuda").cumsum(0).int()
    return q, caches[0], caches[1], starts, torch.tensor(seq_lens, dtype=torch.int32, device="cuda"), block_tables


def time_us(inputs: tuple[torch.Tensor, ...], max_query_len: int, max_seq_len: int, num_splits: int | None) -> float:
    scale = inputs[0].shape[-1] ** -0.5
    out = torch.empty_like(inputs[0])
    run = lambda: paged_attention(*inputs, scale, max_query_len, max_seq_len, out=out, num_splits=num_splits)
    return do_bench(run, warmup=25, rep=200) * 1e3


def kv_bytes(seq_lens: list[int], args: argparse.Namespace) -> int:
    return 2 * sum(seq_lens) * args.num_kv_heads * args.head_dim * getattr(torch, args.dtype).itemsize


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-heads", type=int, default=32)
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--splits-sweep", action="store_true")
    parser.add_argument("--config-sweep", action="store_true")
    parser.add_argument("--mixed-sweep", action="store_true",
                        help="decode over contexts of mixed lengths (the throughput workload's), every split count and "
                             "some configs, contexts in random or longest-first order")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_paged_attention needs a CUDA device")
    print_environment()
    print(f"heads {args.num_heads}/{args.num_kv_heads}, head_dim {args.head_dim}, {args.dtype}, page {BLOCK_SIZE}")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if args.splits_sweep:
        splits_sweep(args)
        return
    if args.config_sweep:
        config_sweep(args)
        return
    if args.mixed_sweep:
        mixed_sweep(args, sms)
        return

    print(f"{'decode':>8} {'context':>8} {'splits':>6} {'us':>9} {'GB/s':>8} {'us (no split)':>14} {'GB/s':>8}")
    for batch in (1, 64, 256):
        for context in (1024, 8192):
            seq_lens = [context] * batch
            inputs = make_inputs([1] * batch, seq_lens, args)
            splits = choose_num_splits(batch * args.num_kv_heads, context, sms)  # decode: a program a request
            auto, single = time_us(inputs, 1, context, None), time_us(inputs, 1, context, 1)
            gbs = kv_bytes(seq_lens, args) / 1e3
            print(f"{batch:>8} {context:>8} {splits:>6} {auto:>9.1f} {gbs / auto:>8.0f} {single:>14.1f} "
                  f"{gbs / single:>8.0f}")
            del inputs

    for query_lens in ([8192], [1024] * 8):
        inputs = make_inputs(query_lens, query_lens, args)
        us = time_us(inputs, max(query_lens), max(query_lens), None)
        causal_flops = sum(4 * n * (n + 1) / 2 * args.num_heads * args.head_dim for n in query_lens)
        print(f"prefill {len(query_lens)} x {query_lens[0]} tokens: {us:.1f} us, "
              f"{kv_bytes(query_lens, args) / 1e3 / us:.0f} GB/s of K/V, {causal_flops / us / 1e6:.0f} TFLOP/s")


def splits_sweep(args: argparse.Namespace) -> None:
    counts = [1, 2, 4, 8, 16, 32]
    print("batch 1: context | " + " | ".join(f"{n} splits us" for n in counts))
    for context in (256, 640, 1024, 2048, 4096):
        inputs = make_inputs([1], [context], args)
        scale = inputs[0].shape[-1] ** -0.5
        out = torch.empty_like(inputs[0])
        times = []
        for splits in counts:
            def run(inputs=inputs, scale=scale, context=context, out=out, splits=splits):
                return paged_attention(*inputs, scale, 1, context, out=out, num_splits=splits)

            run()
            times.append(do_bench_cudagraph(run) * 1e3)
        print(f"{context} | " + " | ".join(f"{t:.1f}" for t in times))



def config_sweep(args: argparse.Namespace) -> None:
    configs = [(n, w, s) for n in (32, 64, 128) for w in (2, 4, 8) for s in (1, 2, 3)]
    for batch in (64, 256):
        for context in (512, 1024, 2048):
            seq_lens = [context] * batch
            inputs = make_inputs([1] * batch, seq_lens, args)
            scale = inputs[0].shape[-1] ** -0.5
            out = torch.empty_like(inputs[0])
            times = {}
            for config in [None, *configs]:
                def run(inputs=inputs, scale=scale, context=context, out=out, config=config):
                    return paged_attention(*inputs, scale, 1, context, out=out, config=config)

                try:
                    run()
                    times[config] = do_bench_cudagraph(run) * 1e3
                except OutOfResources:  # more shared memory than an SM holds
                    print(f"  {config}: out of resources")
            best = sorted((t, c) for c, t in times.items() if c is not None)[:3]
            gbs = kv_bytes(seq_lens, args) / 1e3
            print(f"batch {batch} context {context}: default {times[None]:.1f} us ({gbs / times[None]:.0f} GB/s); "
                  + "; ".join(f"{c} {t:.1f} us ({gbs / t:.0f} GB/s)" for t, c in best))
            del inputs


def mixed_sweep(args: argparse.Namespace, sms: int) -> None:
    """Decode at batch 8-256 over contexts uniform in [200, 2048] (the 256-request workload's range), timed in
    CUDA graphs with max_seq_len 4096 (a graph's bound): each split count and a few (keys, warps, stages) configs.
    "Longest first" passes the contexts sorted (no `order`: the kernel's own ordering adds one load to this)."""
    generator = torch.Generator().manual_seed(0)
    configs = [None, (128, 4, 2), (64, 4, 2), (64, 4, 3), (64, 8, 2), (32, 4, 2), (32, 4, 3)]
    for batch in (256, 128, 64, 32, 16, 8):
        contexts = torch.randint(200, 2049, (batch,), generator=generator).tolist()
        auto = choose_num_splits(batch * args.num_kv_heads, 4096, sms)
        gbs = kv_bytes(contexts, args) / 1e3
        for order, seq_lens in (("random", contexts), ("longest first", sorted(contexts, reverse=True))):
            inputs = make_inputs([1] * batch, seq_lens, args)
            scale = inputs[0].shape[-1] ** -0.5
            out = torch.empty_like(inputs[0])
            cells = []
            for splits in sorted({1, 2, 4, 8, auto}):
                for config in configs:
                    def run(inputs=inputs, scale=scale, out=out, splits=splits, config=config):
                        return paged_attention(*inputs, scale, 1, 4096, out=out, num_splits=splits, config=config)

                    try:
                        run()
                        us = do_bench_cudagraph(run) * 1e3
                    except OutOfResources:
                        continue
                    cells.append((us, splits, config))
            default = next(us for us, splits, config in cells if splits == auto and config is None)
            best = sorted(cells)[:4]
            print(f"batch {batch} {order} (auto {auto} splits): default {default:.1f} us ({gbs / default:.0f} GB/s); "
                  + "; ".join(f"{n} splits {c} {us:.1f} us ({gbs / us:.0f} GB/s)" for us, n, c in best), flush=True)
            del inputs


if __name__ == "__main__":
    main()
