"""Times the fused MoE kernel at a model's expert shapes (default Qwen3-30B-A3B: 128 experts, top 8,
hidden 2048, expert intermediate 768, bf16) for several tokens per step, against the torch reference
and against the GPU's measured bf16 matmul peak and copy bandwidth.

For each token count: microseconds per call (CUDA graph), the expert FLOPs done per second and their share
of the measured bf16 matmul peak (what matters for throughput), and the bytes of the experts actually hit
per second and their share of the copy bandwidth (what matters for decode), for the path the layer picks; the
tiles' and the GEMVs' (wick/kernels/expert_gemv.py, up to GEMV_MAX_PAIRS pairs) times beside it. `--sweep` times
each GEMM alone at every tile shape of SWEEP, then at grid orders and tails, at each token count and prints the best
of each BLOCK_M (the table MOE_CONFIGS in wick/kernels/fused_moe.py).
`--rotate R`: each timed call is one of R calls in a row whose tokens route to R disjoint groups of experts, as a
model's layers each read their own experts; with R = 1 the same experts are read at every call and partly stay in
the L2 cache (50 MB on an H100, where one token's 8 experts of Qwen3-30B-A3B are 75 MB). `--layers L`: the
experts of L layers, call r reading layer r % L's, as a model spreads its experts over its layers' tensors.
`--gguf Q4_K`: also the same routings over experts packed in that GGUF type (fused_experts_gguf), against bf16.
`--fp8`: also the same routings over fp8 experts, scaled over 128 x 128 blocks (FP8 checkpoints) and one scale a
row (`-q fp8`), against bf16; with `--sweep`, every tile shape over both instead of over bf16. `--wna16 BITS`: also
over experts in 4 or 8 bits with groups of 128 (GPTQ/AWQ checkpoints), against bf16; with `--sweep`, every tile
shape over them past the GEMVs' pairs and every GEMV shape of GEMV_SWEEP up to them.

    python -m benchmarks.kernels.bench_fused_moe [--tokens 1 8 64 256 2048 4096 --experts 128 --top-k 8 ...]
    python -m benchmarks.kernels.bench_fused_moe --sweep --skip-reference --json FILE
    python -m benchmarks.kernels.bench_fused_moe --tokens 1 2 4 --skip-reference --rotate 8 --layers 8 --gemv-sweep
    python -m benchmarks.kernels.bench_fused_moe --tokens 1 4 8 --skip-reference --rotate 8 --layers 8 --gguf Q4_K
    python -m benchmarks.kernels.bench_fused_moe --tokens 1 16 256 2048 --skip-reference --layers 8 --fp8
    python -m benchmarks.kernels.bench_fused_moe --tokens 1 16 256 2048 --skip-reference --layers 8 --wna16 4
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Callable
from functools import partial

import torch
from gguf import GGMLQuantizationType
from triton.testing import do_bench, do_bench_cudagraph

from benchmarks.common import copy_bandwidth, print_environment, random_gguf_blocks
from wick.kernels import wna16_matmul
from wick.kernels.expert_gemv import DOWN_CONFIG, GATE_UP_CONFIG, gemv_experts
from wick.kernels.fused_moe import (
    MoeTile,
    WeightScales,
    expert_kind,
    fused_experts,
    moe_config,
    moe_gemm,
)
from wick.kernels.moe_align import moe_align
from wick.layers.moe.fp8_experts import Fp8Experts, fused_experts_fp8
from wick.layers.moe.fused_moe import GEMV_MAX_PAIRS, fused_experts_float, fused_experts_ref
from wick.layers.moe.gguf_experts import PackedExperts, fused_experts_gguf
from wick.layers.moe.routing import select_experts
from wick.layers.moe.wna16_experts import EXPERT_GEMV_MAX_PAIRS, Wna16Experts, fused_experts_wna16

# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages): small row tiles for few pairs an expert, wgmma-sized ones for many.
SWEEP = {
    "small": list(itertools.product([16], [32, 64, 128], [64, 128, 256, 512], [2, 4], [3, 4, 5])),
    "large": list(itertools.product([64, 128], [64, 128, 256], [64], [4, 8], [3, 4])),
}
# (rows a program, columns a step, warps) of the float experts' GEMVs (--gemv-sweep); both GEMVs are timed together,
# one swept while the other keeps its default.
EXPERT_GEMV_SWEEP = list(itertools.product([1, 2, 4, 8], [256, 512, 1024, 2048], [2, 4, 8]))
# The grid orders (row tiles a group; 0: a column at a time) and tails (rows a tile of mostly padding multiplies) tried
# on each GEMM's best shape of each BLOCK_M.
GROUPS = [0, 1, 4]
TAILS = [0, 16, 32]
# Tile shapes over 4- / 8-bit experts, whose B tiles are unpacked in registers at every step.
WNA16_TILE_SWEEP = list(itertools.product([16, 64, 128], [64, 128], [64, 128], [4, 8], [3]))
# (columns, input rows a step, warps, warps an SM that splitting K aims at) of the 4-bit expert GEMV (its steps are
# 128 rows, a group).
GEMV_SWEEP = list(itertools.product([16, 32, 64, 128], [128], [1, 2, 4], [0, 16, 32, 64]))


def matmul_peak(dtype: torch.dtype, size: int = 8192) -> float:
    """FLOP/s of one large square matmul: the practical peak the kernel is measured against."""
    a = torch.randn(size, size, dtype=dtype, device="cuda")
    b = torch.randn(size, size, dtype=dtype, device="cuda")
    ms = do_bench(lambda: a @ b, warmup=50, rep=300)
    return 2 * size**3 / (ms / 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64, 256, 2048, 4096])
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--hidden-size", type=int, default=2048)
    parser.add_argument("--intermediate-size", type=int, default=768)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--json", default=None, help="write the sweep's timings here")
    parser.add_argument("--gemv-sweep", action="store_true", help="time every shape of the float experts' GEMVs")
    parser.add_argument("--rotate", type=int, default=1, help="calls in a row over disjoint expert groups")
    parser.add_argument("--layers", type=int, default=1, help="layers of experts the calls take in turn")
    parser.add_argument("--gguf", default=None, help="also time experts packed in this GGUF type (Q4_K, Q5_K...)")
    parser.add_argument("--gguf-down", default=None, help="with --gguf: the down projections' type (default its)")
    parser.add_argument("--fp8", action="store_true", help="also time fp8 experts (block-scaled and per-row)")
    parser.add_argument("--wna16", type=int, choices=(4, 8), default=None,
                        help="also time experts in these bits with groups of 128 (GPTQ/AWQ)")
    args = parser.parse_args()
    print_environment()
    dtype = getattr(torch, args.dtype)
    e, k, h, i = args.experts, args.top_k, args.hidden_size, args.intermediate_size
    w13 = torch.randn(args.layers, e, 2 * i, h, dtype=dtype, device="cuda").div_(h**0.5)
    w2 = torch.randn(args.layers, e, h, i, dtype=dtype, device="cuda").div_(i**0.5)
    peak, bandwidth = matmul_peak(dtype), copy_bandwidth()
    expert_bytes = (w13[0, 0].numel() + w2[0, 0].numel()) * w13.element_size()
    print(f"experts {e}, top-{k}, hidden {h}, intermediate {i}, {args.dtype}; "
          f"bf16 matmul peak {peak / 1e12:.0f} TFLOP/s, copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    if args.sweep and args.wna16:
        layers = wna16_layers(args, dtype)
        tiles = ([w13.qweight for w13, _ in layers], [w2.qweight for _, w2 in layers],
                 [w13.group_scales for w13, _ in layers], [w2.group_scales for _, w2 in layers])
        print(f"{args.wna16}-bit experts, groups of 128:")
        gemv_sweep([t for t in args.tokens if t * k <= EXPERT_GEMV_MAX_PAIRS], layers, args)
        sweep([t for t in args.tokens if t * k > EXPERT_GEMV_MAX_PAIRS], tiles, e, k, h, i, dtype, None, args.rotate,
              "packed")
    elif args.sweep:
        if not args.fp8:
            sweep(args.tokens, (w13, w2, None, None), e, k, h, i, dtype, args.json, args.rotate)
        else:
            kinds = (("128 x 128 scale blocks", ((128, 128), (128, 128))), ("a scale a row", ((1, h), (1, i))))
            for name, blocks in kinds:
                print(f"fp8 experts, {name}:")
                layers = fp8_layers(w13, w2, *blocks)
                sweep(args.tokens, layers, e, k, h, i, dtype, None, args.rotate, expert_kind(layers[2][0], h))
    if args.gemv_sweep:
        expert_gemv_sweep(args.tokens, w13, w2, args)
    print(f"{args.rotate} expert group(s) in turn, over {args.layers} layer(s) of experts; 'picked': the path the "
          "layer picks, the figures after it its")
    print("tokens | tiles us | gemv us | picked us | torch us | TFLOP/s | % of matmul peak | experts hit | GB/s read | "
          "% of bandwidth")
    for tokens in args.tokens:
        x = torch.randn(tokens, h, dtype=dtype, device="cuda")
        routes = routings(tokens, e, k, args.rotate)
        weights, ids = routes[0]
        tiles_ms = time_ms(x, w13, w2, routes)
        gemv_ms = float_ms(x, w13, w2, routes, "gemv") if tokens * k <= GEMV_MAX_PAIRS else float("nan")
        ms = float_ms(x, w13, w2, routes, None)
        ref = float("nan")
        if not args.skip_reference:
            ref = do_bench(lambda x=x, weights=weights, ids=ids: fused_experts_ref(x, w13[0], w2[0], weights, ids))
        flops = 2 * tokens * k * 3 * h * i
        hit = ids.unique().numel()
        read = hit * expert_bytes + 2 * x.numel() * x.element_size()
        seconds = ms / 1e3
        print(f"{tokens} | {tiles_ms * 1e3:.1f} | {gemv_ms * 1e3:.1f} | {ms * 1e3:.1f} | {ref * 1e3:.1f} | "
              f"{flops / seconds / 1e12:.1f} | "
              f"{flops / seconds / peak:.0%} | {hit} | {read / seconds / 1e9:.0f} | {read / seconds / bandwidth:.0%}")
    if args.gguf:
        time_packed(args, GGMLQuantizationType[args.gguf], GGMLQuantizationType[args.gguf_down or args.gguf], dtype,
                    bandwidth, w13, w2)
    if args.fp8:
        time_fp8(args, dtype, bandwidth, w13, w2)
    if args.wna16:
        time_wna16(args, dtype, bandwidth, w13, w2)


def wna16_layers(args: argparse.Namespace, dtype: torch.dtype) -> list[tuple[Wna16Experts, Wna16Experts]]:
    """Each layer's (w13, w2) in args.wna16 bits, random words, groups of 128 with scales putting the weights near
    the bf16 ones' range."""
    e, h, i, bits = args.experts, args.hidden_size, args.intermediate_size, args.wna16

    def experts(k: int, n: int) -> Wna16Experts:
        qweight = torch.randint(-(1 << 31), 1 << 31, (e, k * bits // 32, n), dtype=torch.int64,
                                device="cuda").to(torch.int32)
        shape = (e, -(-k // 128), n)
        scales = torch.full(shape, 2 / (k**0.5 * (1 << bits)), dtype=dtype, device="cuda")
        return Wna16Experts(qweight, scales, torch.full(shape, 1 << (bits - 1), dtype=dtype, device="cuda"), bits, 128)

    return [(experts(h, 2 * i), experts(i, h)) for _ in range(args.layers)]


def time_wna16(args: argparse.Namespace, dtype: torch.dtype, bandwidth: float, w13: torch.Tensor,
               w2: torch.Tensor) -> None:
    """fused_experts_wna16 on each path against the bf16 kernel, same routings, same layers."""
    layers = wna16_layers(args, dtype)
    q13, q2 = layers[0]
    expert_bytes = sum(t[0].numel() * t.element_size() for t in (q13.qweight, q13.scales, q13.zeros, q2.qweight,
                                                                  q2.scales, q2.zeros))
    paths = ("gemv", "tiles", None)
    names = " | ".join(f"{path or 'picked'} us" for path in paths)
    print(f"{args.wna16}-bit experts, groups of 128 ({expert_bytes / 1e6:.2f} MB an expert with its scales and zero "
          f"points), {args.layers} layer(s) in turn; 'picked': the path the layer picks")
    print(f"tokens | bf16 us | {names} | picked vs bf16 | "
          "GB/s of the bytes hit | % of bandwidth")
    for tokens in args.tokens:
        x = torch.randn(tokens, args.hidden_size, dtype=dtype, device="cuda")
        routes = routings(tokens, args.experts, args.top_k, args.rotate)
        bf16_ms = time_ms(x, w13, w2, routes)
        times = [wna16_ms(x, layers, routes, path) for path in paths]
        read = routes[0][1].unique().numel() * expert_bytes / (times[2] / 1e3)
        print(f"{tokens} | {bf16_ms * 1e3:.1f} | {' | '.join(f'{t * 1e3:.1f}' for t in times)} | "
              f"{bf16_ms / times[2]:.2f}x | {read / 1e9:.0f} | {read / bandwidth:.0%}")


def wna16_ms(x: torch.Tensor, layers: list, routes: list, path: str | None) -> float:
    def run() -> None:
        for r, (weights, ids) in enumerate(routes):
            fused_experts_wna16(x, *layers[r % len(layers)], weights, ids, path)

    run()
    return graph_ms(run) / len(routes)


def gemv_sweep(token_counts: list[int], layers: list, args: argparse.Namespace) -> None:
    """The GEMV path at every shape of GEMV_SWEEP (wna16_matmul.EXPERT_GEMV_CONFIG set for each): the default's and
    the best's microseconds."""
    default = wna16_matmul.EXPERT_GEMV_CONFIG
    for tokens in token_counts:
        x = torch.randn(tokens, args.hidden_size, dtype=layers[0][0].scales.dtype, device="cuda")
        routes = routings(tokens, args.experts, args.top_k, args.rotate)
        timings = {}
        for config in [default, *GEMV_SWEEP]:
            wna16_matmul.EXPERT_GEMV_CONFIG = config
            timings[config] = wna16_ms(x, layers, routes, "gemv") * 1e3
        wna16_matmul.EXPERT_GEMV_CONFIG = default
        best = min(timings, key=timings.get)
        print(f"GEMV sweep {tokens} tokens: default {default} {timings[default]:.1f} us, best {best} "
              f"{timings[best]:.1f} us; " + ", ".join(f"{c}: {t:.1f}" for c, t in sorted(timings.items(),
                                                                                    key=lambda kv: kv[1])[:5]))


def fp8_layers(w13: torch.Tensor, w2: torch.Tensor, block13: tuple[int, int], block2: tuple[int, int]) -> tuple:
    """Each layer's w13, w2 [E, N, K] of [layers, E, N, K] in e4m3, with scales of 1 over block tiles (lists, as a
    model's layers hold their own tensors)."""

    def scales(w: torch.Tensor, block: tuple[int, int]) -> list[WeightScales]:
        _, experts, n, k = w.shape
        shape = (experts, -(-n // block[0]), -(-k // block[1]))
        return [(torch.ones(shape, dtype=torch.float32, device=w.device), block) for _ in w]

    return ([layer.to(torch.float8_e4m3fn) for layer in w13], [layer.to(torch.float8_e4m3fn) for layer in w2],
            scales(w13, block13), scales(w2, block2))


def time_fp8(args: argparse.Namespace, dtype: torch.dtype, bandwidth: float, w13: torch.Tensor,
             w2: torch.Tensor) -> None:
    """fp8 experts, block-scaled and per-row, on each path of fused_experts_fp8 against the bf16 kernel, same routings,
    same layers."""
    h, i = args.hidden_size, args.intermediate_size
    kinds = {}
    for name, blocks in (("block", ((128, 128), (128, 128))), ("row", ((1, h), (1, i)))):
        f13, f2, s13, s2 = fp8_layers(w13, w2, *blocks)
        kinds[name] = [(Fp8Experts(f13[n], *s13[n], dtype), Fp8Experts(f2[n], *s2[n], dtype)) for n in range(len(f13))]
    expert_bytes = 3 * h * i
    paths = ("gemv", "tiles", None)
    print(f"fp8 experts ({expert_bytes / 1e6:.2f} MB an expert), {args.layers} layer(s) in turn; 'picked': the path "
          "the layer picks")
    columns = " | ".join(f"{kind} {path or 'picked'} us" for kind in kinds for path in paths)
    print(f"tokens | bf16 us | {columns} | "
          "block picked vs bf16 | GB/s of the fp8 bytes hit (block picked) | % of bandwidth")
    for tokens in args.tokens:
        x = torch.randn(tokens, h, dtype=dtype, device="cuda")
        routes = routings(tokens, args.experts, args.top_k, args.rotate)
        bf16_ms = time_ms(x, w13, w2, routes)

        def run(layers: list, path: str | None, x: torch.Tensor = x, routes: list = routes) -> None:
            for r, (weights, ids) in enumerate(routes):
                fused_experts_fp8(x, *layers[r % len(layers)], weights, ids, path)

        times = []
        for layers in kinds.values():
            for path in paths:
                run(layers, path)
                times.append(graph_ms(partial(run, layers, path)) / len(routes))
        read = routes[0][1].unique().numel() * expert_bytes / (times[2] / 1e3)
        print(f"{tokens} | {bf16_ms * 1e3:.1f} | {' | '.join(f'{t * 1e3:.1f}' for t in times)} | "
              f"{bf16_ms / times[2]:.2f}x | {read / 1e9:.0f} | {read / bandwidth:.0%}")


def _random_packed(experts: int, rows: int, columns: int, qtype: GGMLQuantizationType,
                   dtype: torch.dtype) -> PackedExperts:
    return PackedExperts(random_gguf_blocks(qtype, experts, rows, columns), qtype, columns, dtype)


def time_packed(args: argparse.Namespace, qtype: GGMLQuantizationType, down_type: GGMLQuantizationType,
                dtype: torch.dtype, bandwidth: float, w13: torch.Tensor, w2: torch.Tensor) -> None:
    """fused_experts_gguf over experts packed in `qtype` (down projections in `down_type`) against the bf16 kernel,
    same routings, same layers."""
    e, k, h, i = args.experts, args.top_k, args.hidden_size, args.intermediate_size
    layers = [(_random_packed(e, 2 * i, h, qtype, dtype), _random_packed(e, h, i, down_type, dtype))
              for _ in range(args.layers)]
    expert_bytes = layers[0][0].data[0].numel() + layers[0][1].data[0].numel()
    print(f"experts packed in {qtype.name}, down projections in {down_type.name} ({expert_bytes / 1e6:.2f} MB an "
          f"expert), {args.layers} layer(s) in turn")
    paths = ("gemv", "tiles", "decoded")
    print(f"tokens | bf16 us | {' us | '.join(f'{qtype.name} {path}' for path in paths)} us | as the layer picks, "
          "us | vs bf16 | GB/s of the packed bytes hit | % of bandwidth")
    for tokens in args.tokens:
        x = torch.randn(tokens, h, dtype=dtype, device="cuda")
        routes = routings(tokens, e, k, args.rotate)

        def run(path: str | None, routes: list = routes, x: torch.Tensor = x) -> None:
            for r, (weights, ids) in enumerate(routes):
                fused_experts_gguf(x, *layers[r % len(layers)], weights, ids, path)

        times = []
        for path in (*paths, None):
            run(path)
            times.append(graph_ms(partial(run, path)) / len(routes))
        bf16_ms = time_ms(x, w13, w2, routes)
        picked = times[-1]
        read = routes[0][1].unique().numel() * expert_bytes / (picked / 1e3)
        print(f"{tokens} | {bf16_ms * 1e3:.1f} | {' | '.join(f'{t * 1e3:.1f}' for t in times)} | "
              f"{bf16_ms / picked:.2f}x | {read / 1e9:.0f} | {read / bandwidth:.0%}")


def routings(tokens: int, experts: int, top_k: int, groups: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(weights, ids) of `groups` routings, the g-th choosing among the g-th of `groups` equal groups of experts."""
    size = experts // groups
    routes = []
    for g in range(groups):
        logits = torch.randn(tokens, experts, device="cuda")
        logits[:, g * size:(g + 1) * size] += 100.0
        routes.append(select_experts(logits, top_k, renormalize=True))
    return routes


def time_ms(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
            routes: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Milliseconds a call of fused_experts over float experts, in a CUDA graph of one call per routing; w13, w2
    [layers, ...]: call r reads layer r % layers."""

    def run() -> None:
        for r, (weights, ids) in enumerate(routes):
            layer = r % len(w13)
            fused_experts(x, w13[layer], w2[layer], weights, ids)

    run()
    return graph_ms(run) / len(routes)


def float_ms(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, routes: list, path: str | None,
             configs: tuple = (None, None)) -> float:
    """Milliseconds a call of fused_experts_float on `path` (None: the layer's pick; configs: the GEMVs', for "gemv"),
    call r reading layer r % layers."""

    def run() -> None:
        for r, (weights, ids) in enumerate(routes):
            layer = r % len(w13)
            if configs != (None, None):
                gemv_experts(x, w13[layer], w2[layer], weights, ids, *configs)
            else:
                fused_experts_float(x, w13[layer], w2[layer], weights, ids, path)

    run()
    return graph_ms(run) / len(routes)


def expert_gemv_sweep(token_counts: list[int], w13: torch.Tensor, w2: torch.Tensor, args: argparse.Namespace) -> None:
    """Each GEMV of the float experts' gemv path at every shape of EXPERT_GEMV_SWEEP (the other at its default): the
    default's and the best's microseconds."""
    for tokens in token_counts:
        x = torch.randn(tokens, args.hidden_size, dtype=w13.dtype, device="cuda")
        routes = routings(tokens, args.experts, args.top_k, args.rotate)
        for name, default, place in (("gate/up", GATE_UP_CONFIG, 0), ("down", DOWN_CONFIG, 1)):
            timings = {}
            for config in [default, *EXPERT_GEMV_SWEEP]:
                configs = [GATE_UP_CONFIG, DOWN_CONFIG]
                configs[place] = config
                timings[config] = float_ms(x, w13, w2, routes, "gemv", tuple(configs)) * 1e3
            best = min(timings, key=timings.get)
            print(f"expert GEMV sweep, {name}, {tokens} tokens: default {default} {timings[default]:.1f} us, best "
                  f"{best} {timings[best]:.1f} us; " + ", ".join(
                      f"{c}: {t:.1f}" for c, t in sorted(timings.items(), key=lambda kv: kv[1])[:6]))


def graph_ms(fn: Callable[[], None]) -> float:
    """do_bench_cudagraph(fn) once the default stream's work is done: it runs fn at once on a stream of its own, which
    read top-k ids not yet written (an illegal address in the kernels) before this synchronize."""
    torch.cuda.synchronize()
    return do_bench_cudagraph(fn)


def sweep(token_counts: list[int], layers: tuple, experts: int, top_k: int, hidden: int, intermediate: int,
          dtype: torch.dtype, json_path: str | None, groups: int, kind: str = "float") -> None:
    """Each GEMM alone, the gate/up one and the down one, over the pairs sorted for its BLOCK_M: every tile shape of
    SWEEP (WNA16_TILE_SWEEP over 4- or 8-bit experts, kind "packed"), then the best shape of each BLOCK_M at every grid
    order of GROUPS and tail of TAILS; the default's and the best's microseconds at every token count."""
    w13, w2, s13, s2 = layers
    results = {}
    for tokens in token_counts:
        x = torch.randn(tokens, hidden, dtype=dtype, device="cuda")
        routes = [(weights.float().contiguous(), ids) for weights, ids in routings(tokens, experts, top_k, groups)]
        pairs = tokens * top_k
        mid = torch.randn(pairs, intermediate, dtype=dtype, device="cuda")
        out = torch.empty(pairs, hidden, dtype=dtype, device="cuda")
        layouts: dict[int, list] = {}

        def gemm_us(gated: bool, tile: MoeTile, routes: list = routes, x: torch.Tensor = x, mid: torch.Tensor = mid,
                    out: torch.Tensor = out, pairs: int = pairs, layouts: dict = layouts) -> float:
            layout = layouts.setdefault(tile.block_m, [moe_align(ids, experts, tile.block_m) for _, ids in routes])

            def run() -> None:
                for r, (weights, _) in enumerate(routes):
                    layer = r % len(w13)
                    if gated:
                        moe_gemm(x, w13[layer], s13 and s13[layer], mid, weights, layout[r], pairs, top_k, True, False,
                                 tile)
                    else:
                        moe_gemm(mid, w2[layer], s2 and s2[layer], out, weights, layout[r], pairs, 1, False, False,
                                 tile)

            run()
            return graph_ms(run) / len(routes) * 1e3

        results[tokens] = {}
        shapes = WNA16_TILE_SWEEP if kind == "packed" else SWEEP["small" if pairs <= 512 else "large"]
        for gemm, default in zip(("gate/up", "down"), moe_config(pairs, dtype, kind), strict=True):
            timings = {}
            for tile in [default, *(MoeTile(*shape) for shape in shapes)]:
                try:
                    timings[tile] = gemm_us(gemm == "gate/up", tile)
                except Exception as error:  # a tile too large for the shared memory
                    print(f"{tokens} tokens, {gemm} {tuple(tile)}: {type(error).__name__}")
            for block_m in {tile.block_m for tile in timings}:
                shape = min((tile for tile in timings if tile.block_m == block_m), key=timings.get)
                for group_m, tail_m in itertools.product(GROUPS, TAILS):
                    tile = shape._replace(group_m=group_m, tail_m=tail_m if tail_m < block_m else 0)
                    if tile not in timings:
                        timings[tile] = gemm_us(gemm == "gate/up", tile)
                best = min((tile for tile in timings if tile.block_m == block_m), key=timings.get)
                print(f"sweep {tokens} tokens, {gemm}, BLOCK_M {block_m}: best {tuple(best)} {timings[best]:.1f} us")
            best = min(timings, key=timings.get)
            print(f"sweep {tokens} tokens, {gemm}: default {tuple(default)} {timings[default]:.1f} us, best "
                  f"{tuple(best)} {timings[best]:.1f} us")
            results[tokens][gemm] = {"default": list(default), "best": list(best),
                                     "timings": [[*tile, us] for tile, us in timings.items()]}
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
