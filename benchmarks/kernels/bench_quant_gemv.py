"""The quantized GEMV kernels (one row of x: a decode step of one request) and the Triton GEMV over bf16 weights
(`dense`; `dense_silu`: gated, a layer's rows as gate and up) against bf16's x @ W^T (cuBLAS), at the linear
layers of a model's shape, inside CUDA graphs: microseconds, GB/s of the weights' bytes and the share of the copy
bandwidth. Each layer runs over copies of its weights that together exceed the L2 cache several times, in turn, as
a decode step meets them: from memory, not from L2. `--sweep` times every (rows or columns per program, step,
warps[, warps an SM that splitting K aims at]) of each kernel and names the one with the least time over the layers
(the defaults in wick/kernels/).

    python -m benchmarks.kernels.bench_quant_gemv [--model llama-3.1-8b] [--lm-head]
        [--formats q4_k,gptq,fp8,dense,...] [--sweep] [--json FILE]
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Callable
from functools import partial

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from triton.testing import do_bench_cudagraph

from benchmarks.common import copy_bandwidth, print_environment, random_gguf_blocks
from wick.kernels import gguf_int8_gemv
from wick.kernels import gguf_matmul as gguf_matmul_module
from wick.kernels.dense_gemv import dense_gemv
from wick.kernels.fp8_matmul import FP8_GEMV_CONFIG, fp8_matmul
from wick.kernels.gguf_matmul import gguf_matmul
from wick.kernels.pdl import hopper_or_later
from wick.kernels.wna16_matmul import WNA16_GEMV_CONFIG, wna16_matmul
from wick.loader.presets import get_preset_config

GROUP = 128
# Bytes of each layer's copies together: the H100's and H200's L2 hold 50 MB.
COLD_BYTES = 400 << 20
SWEEPS = {
    "q4_k": list(itertools.product([4, 8, 16], [2, 4], [1, 2, 4], [0, 16, 32, 64])),
    "gptq": list(itertools.product([16, 32, 64], [128, 256], [2, 4], [0, 16, 24, 32])),
    "fp8": list(itertools.product([2, 4, 8, 16], [512, 1024, 2048, 4096], [2, 4, 8])),
    "fp8_block": list(itertools.product([2, 4, 8, 16], [128, 512, 1024, 2048, 4096], [2, 4, 8])),
    "q5_k": list(itertools.product([4, 8, 16], [2, 4], [1, 2, 4], [0, 16, 32, 64])),
    "q3_k": list(itertools.product([4, 8, 16], [1, 2], [1, 2, 4], [0, 16, 32])),
    "q4_0": list(itertools.product([4, 8, 16], [1, 2], [1, 2, 4], [0, 16, 32])),
    "q6_k": list(itertools.product([4, 8, 16], [1, 2], [1, 2, 4], [0, 16, 32])),
    "q8_0": list(itertools.product([4, 8, 16], [1, 2], [1, 2, 4], [0, 16, 32])),
    "q2_k": list(itertools.product([4, 8, 16], [1, 2], [1, 2], [0, 16, 32])),
    "iq4_xs": list(itertools.product([4, 8, 16], [1, 2], [1, 2], [0, 16, 32])),
    "iq4_nl": list(itertools.product([4, 8, 16], [1, 2], [1, 2], [0, 16, 32])),
    # None: the defaults by shape. Past 64 products a thread the accumulator spills.
    "dense": [None] + [c for c in itertools.product([2, 4, 8, 16], [512, 1024, 2048], [2, 4, 8])
              if c[0] * c[1] <= 64 * 32 * c[2]],
}
# The gated GEMV reads twice a config's rows.
SWEEPS["dense_silu"] = [None] + [c for c in SWEEPS["dense"][1:] if 2 * c[0] * c[1] <= 64 * 32 * c[2]] + [
    (1, 1024, 4), (1, 2048, 4), (1, 2048, 8)]
# The float GEMV's shapes (an older tree's types without an int8 GEMV), and for the types without a sweep above.
FLOAT_SWEEP = list(itertools.product([8, 16, 32, 64], [1, 2], [2, 4, 8], [0, 16, 32]))
# A GGUF type's default is its int8 GEMV's Q*_GEMV_CONFIG, on Hopper its Q*_TMA_GEMV_CONFIG where it has one (the
# kernel that takes its blocks by TMA; looked up by name, so that the benchmark also runs over an older tree's
# kernels).
DEFAULTS = {"gptq": WNA16_GEMV_CONFIG, "fp8": FP8_GEMV_CONFIG, "fp8_block": FP8_GEMV_CONFIG, "dense": None,
            "dense_silu": None}


def layer_shapes(model: str, lm_head: bool) -> list[tuple[str, int, int]]:
    """(name, N, K) of a preset model's linear layers as wick merges them (an MoE model's attention only), and its
    LM head where asked."""
    config = get_preset_config(model)
    hidden, heads = config.hidden_size, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    q, kv = heads * head_dim, config.num_key_value_heads * head_dim
    shapes = [("qkv", q + 2 * kv, hidden), ("o", hidden, q)]
    if not (getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)):
        shapes += [("gate_up", 2 * config.intermediate_size, hidden), ("down", hidden, config.intermediate_size)]
    return shapes + ([("lm_head", config.vocab_size, hidden)] if lm_head else [])


LLAMA_8B = layer_shapes("llama-3.1-8b", lm_head=False)


def _default(fmt: str) -> tuple | None:
    if fmt in DEFAULTS:
        return DEFAULTS[fmt]
    qtype = GGMLQuantizationType[fmt.upper()]
    floats = getattr(gguf_matmul_module, "FLOAT_GEMV_CONFIGS", {})
    tma = hopper_or_later(torch.device("cuda")) and getattr(gguf_int8_gemv, f"{qtype.name}_TMA_GEMV_CONFIG", None)
    return (tma or getattr(gguf_int8_gemv, f"{qtype.name}_GEMV_CONFIG", None)
            or floats.get(GGML_QUANT_SIZES[qtype][0]))


def _bf16(n: int, k: int) -> tuple[Callable, int]:
    weight = torch.randn(n, k, dtype=torch.bfloat16, device="cuda")
    return lambda x, config: torch.matmul(x, weight.t()), weight.numel() * 2


def _dense(n: int, k: int, activation: str | None = None) -> tuple[Callable, int]:
    """The float GEMV; with `activation`, over the layer's rows as gate and up halves, writing act(gate) * up."""
    weight = torch.randn(n, k, dtype=torch.bfloat16, device="cuda")
    return lambda x, config: dense_gemv(x, weight, config=config, activation=activation), weight.numel() * 2


def _gguf(qtype: GGMLQuantizationType, n: int, k: int) -> tuple[Callable, int]:
    data = random_gguf_blocks(qtype, n, k)
    return lambda x, config: gguf_matmul(x, data, qtype, (n, k), gemv_config=config), data.numel()


def _gptq(n: int, k: int) -> tuple[Callable, int]:
    qweight = torch.randint(-(1 << 31), 1 << 31, (k // 8, n), dtype=torch.int64, device="cuda").to(torch.int32)
    scales = torch.full((k // GROUP, n), 1e-3, dtype=torch.bfloat16, device="cuda")
    zeros = torch.full_like(scales, 8.0)
    g_idx = (torch.arange(k, device="cuda") // GROUP).to(torch.int32)
    nbytes = qweight.numel() * 4 + scales.numel() * 4
    return (lambda x, config: wna16_matmul(x, qweight, scales, zeros, g_idx, 4, group=GROUP, gemv_config=config),
            nbytes)


def _fp8(n: int, k: int, block: tuple[int, int] | None = None) -> tuple[Callable, int]:
    """FP8 weights with one scale a row (in situ), or over `block` tiles (FP8 checkpoints)."""
    block = block or (1, k)
    weight = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
    scale = torch.full((-(-n // block[0]), -(-k // block[1])), 1e-3, dtype=torch.float32, device="cuda")
    return (lambda x, config: fp8_matmul(x, weight, scale, block, gemv_config=config),
            weight.numel() + scale.numel() * 4)


# Any other format names a GGUF type (q5_0, q3_k, ...): its int8 GEMV where it has one, else the float GEMV.
MAKERS = {"gptq": _gptq, "fp8": _fp8, "fp8_block": partial(_fp8, block=(128, 128)), "dense": _dense,
          "dense_silu": partial(_dense, activation="silu")}


def _cold(make: Callable[[int, int], tuple[Callable, int]], n: int, k: int) -> tuple[Callable, int, int]:
    """Copies of one layer's weights, COLD_BYTES in all: a function of (x, config) that runs them in turn, the
    bytes of one copy and the number of copies."""
    first, nbytes = make(n, k)
    layers = [first] + [make(n, k)[0] for _ in range(-(-COLD_BYTES // nbytes) - 1)]

    def run(x: torch.Tensor, config: tuple) -> None:
        for layer in layers:
            layer(x, config)

    return run, nbytes, len(layers)


def _time_us(fn: Callable[[], object]) -> float:
    fn()
    return do_bench_cudagraph(fn, rep=20) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama-3.1-8b", help="a preset's name (wick/loader/presets.py)")
    parser.add_argument("--lm-head", action="store_true", help="time the LM head's shape too")
    parser.add_argument("--formats", default="q4_k,gptq,fp8")
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--json", default=None, help="write every timing here")
    args = parser.parse_args()
    print_environment()
    bandwidth = copy_bandwidth()
    shapes = layer_shapes(args.model, args.lm_head)
    print(f"copy bandwidth: {bandwidth / 1e12:.2f} TB/s; layers of {args.model}, one row of x (bf16)")
    x = {k: torch.randn(1, k, dtype=torch.bfloat16, device="cuda") for k in {k for _, _, k in shapes}}
    results: dict = {"bandwidth": bandwidth, "bf16": {}, "formats": {}}
    bf16_total = 0.0
    for name, n, k in shapes:
        run, nbytes, copies = _cold(_bf16, n, k)
        us = _time_us(partial(run, x[k], None)) / copies
        bf16_total += us
        results["bf16"][name] = us
        print(f"bf16  {name:>8} {n:>6}x{k:<6} {us:8.1f} us  {nbytes / us / 1e3:7.0f} GB/s "
              f"({nbytes / us * 1e6 / bandwidth:4.0%})  ({copies} copies)")
        del run
        torch.cuda.empty_cache()
    for fmt in args.formats.split(","):
        make = MAKERS.get(fmt) or partial(_gguf, GGMLQuantizationType[fmt.upper()])
        layers = [(name, *_cold(make, n, k), k) for name, n, k in shapes]
        configs = SWEEPS.get(fmt, FLOAT_SWEEP) if args.sweep else [_default(fmt)]
        timings: dict[str, dict[str, float]] = {}
        for config in configs:
            try:
                timings[str(config)] = {name: _time_us(partial(fn, x[k], config)) / copies
                                        for name, fn, _, copies, k in layers}
            except Exception as error:  # a tile too large for the registers or shared memory
                print(f"{fmt} {config}: {type(error).__name__}")
        best = min(timings, key=lambda c: sum(timings[c].values()))
        for label, config in (("default", str(_default(fmt))), ("best", best)):
            if config not in timings:
                continue
            total = sum(timings[config].values())
            for name, _, nbytes, _, _ in layers:
                us = timings[config][name]
                print(f"{fmt:5} {label:>7} {config:>15} {name:>8} {us:8.1f} us  {nbytes / us / 1e3:7.0f} GB/s "
                      f"({nbytes / us * 1e6 / bandwidth:4.0%})  {results['bf16'][name] / us:4.2f}x bf16")
            print(f"{fmt:5} {label:>7} {config:>15}    total {total:8.1f} us  {bf16_total / total:4.2f}x bf16")
        results["formats"][fmt] = {"default": str(_default(fmt)), "best": best, "timings": timings,
                                   "bytes": {name: nbytes for name, _, nbytes, _, _ in layers}}
        del layers
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
