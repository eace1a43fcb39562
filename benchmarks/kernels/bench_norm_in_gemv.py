"""A decode layer's float GEMVs at batch 1 with their RMSNorms as kernels against the norms inside the GEMVs.

Per layer, in CUDA graphs over distinct weights (more than the L2 cache holds): norm -> qkv -> o -> norm ->
gate/up (gated) -> down, against qkv and gate/up each norming x + the residual themselves (a RowNorm). Prints
microseconds a layer for the default GEMV shapes and a few others for the normed GEMVs.
"""

from __future__ import annotations

import argparse

import torch

from wick.kernels import pdl
from wick.kernels.dense_gemv import dense_gemv
from wick.kernels.rms_norm import RowNorm, fused_add_rms_norm

# hidden, q/k/v rows, o's input, intermediate, layers (enough for the weights to overflow the L2 cache)
SHAPES = {
    "qwen3-0.6b": (1024, 4096, 2048, 3072, 28),
    "qwen3-30b-a3b-dense": (2048, 5120, 4096, 6144, 12),  # its experts' bytes at one token as one MLP
    "llama-3.1-8b": (4096, 6144, 4096, 14336, 8),
}
DTYPE = torch.bfloat16


def _weights(hidden: int, qkv: int, o_in: int, inter: int, layers: int) -> list[dict[str, torch.Tensor]]:
    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=DTYPE) * 0.02

    return [{"qkv": w(qkv, hidden), "o": w(hidden, o_in), "gate_up": w(2 * inter, hidden), "down": w(hidden, inter),
             "norm1": torch.ones(hidden, device="cuda", dtype=DTYPE),
             "norm2": torch.ones(hidden, device="cuda", dtype=DTYPE)} for _ in range(layers)]


def norm_kernels(layers: list, x: torch.Tensor, residual: torch.Tensor, config: tuple | None) -> torch.Tensor:
    for w in layers:
        h, residual = fused_add_rms_norm(x, residual, w["norm1"], 1e-6)
        x = dense_gemv(dense_gemv(h, w["qkv"])[..., : w["o"].shape[1]], w["o"])
        h, residual = fused_add_rms_norm(x, residual, w["norm2"], 1e-6)
        x = dense_gemv(dense_gemv(h, w["gate_up"], activation="silu"), w["down"])
    return x


def norms_in_gemvs(layers: list, x: torch.Tensor, residual: torch.Tensor, config: tuple | None) -> torch.Tensor:
    for w in layers:
        norm = RowNorm(w["norm1"], 1e-6, residual, torch.empty_like(residual), torch.empty_like(x))
        qkv = dense_gemv(x, w["qkv"], config=config, norm=norm)
        x, residual = dense_gemv(qkv[..., : w["o"].shape[1]], w["o"]), norm.residual_out
        norm = RowNorm(w["norm2"], 1e-6, residual, torch.empty_like(residual), torch.empty_like(x))
        x = dense_gemv(dense_gemv(x, w["gate_up"], config=config, activation="silu", norm=norm), w["down"])
        residual = norm.residual_out
    return x


def time_layer(chain, layers: list, hidden: int, config: tuple | None, replays: int) -> float:
    """Median over five timings of `replays` graph replays, microseconds a layer."""
    x = torch.randn(1, hidden, device="cuda", dtype=DTYPE)
    residual = torch.randn(1, hidden, device="cuda", dtype=DTYPE)
    chain(layers, x, residual.clone(), config)  # compiles
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        chain(layers, x, residual.clone(), config)
    for _ in range(10):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / replays / len(layers))
    return sorted(times)[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--replays", type=int, default=100)
    args = parser.parse_args()
    for name in args.shapes:
        hidden, *_ = shape = SHAPES[name]
        pdl.set_release_early(hidden, False)  # the order the models of these shapes take
        layers = _weights(*shape)
        x, residual = (torch.randn(1, hidden, device="cuda", dtype=DTYPE) for _ in range(2))
        diff = (norm_kernels(layers[:2], x, residual.clone(), None)
                - norms_in_gemvs(layers[:2], x, residual.clone(), None)).abs().max().item()
        step = 2048 if hidden >= 2048 else 1024
        row = [f"norm kernels {time_layer(norm_kernels, layers, hidden, None, args.replays):.2f}"]
        for config in (None, (1, step, 4), (4, step, 8), (4, 1024, 4), (8, 1024, 8)):
            took = time_layer(norms_in_gemvs, layers, hidden, config, args.replays)
            row.append(f"in GEMVs {config or 'default'} {took:.2f}")
        print(f"{name} (two layers differ by {diff:.3g}), us a layer: " + "; ".join(row), flush=True)


if __name__ == "__main__":
    main()
