"""Float MoE experts at decode as two GEMVs, each (token, expert) pair reading its expert's rows of W once:

- gate/up: a program takes BLOCK_N rows of a pair's gate projection and the same rows of its up projection and
  writes silu(gate) * up (in float32, rounded once), so no activation kernel runs between the two;
- down: a program takes BLOCK_N output rows of one token and sums its top-k experts' products, each times its
  routing weight, in float32, so no kernel sums the pairs afterwards.

With few pairs the fused MoE kernel's tl.dot tiles (wick/kernels/fused_moe.py) read the experts at ~75% of the
bandwidth; these read them as the dense GEMV reads a linear layer (docs/benchmarks.md, session 21). K is a
constexpr: the steps along it are unrolled, so a program's loads over all of its experts can be in flight at once.

Under programmatic dependent launch (pdl.py) the gate/up GEMV waits for the routing before it reads anything
(which experts to read is the routing's output), then lets the down GEMV launch: that one starts only once every
gate/up program has waited, so the routing has ended and the down GEMV may read the expert ids and load its first
expert's weights before it waits for the gate/up products.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wick.kernels.pdl import pdl_options

# (rows a program, columns a step, warps) of each GEMV (`benchmarks/kernels/bench_fused_moe.py --gemv-sweep`,
# Qwen3-30B-A3B's experts on an H100); a step wider than K is cut to K's next power of two.
GATE_UP_CONFIG = (1, 512, 2)
DOWN_CONFIG = (2, 512, 2)


@triton.jit
def _gate_up_kernel(x_ptr, w_ptr, ids_ptr, out_ptr, inter, stride_xm, stride_we, stride_wn, K: tl.constexpr,
                    X_ROW_DIV: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    """out[pair, n] = silu(x[pair // X_ROW_DIV] . W_e[n]) * (x[pair // X_ROW_DIV] . W_e[inter + n]), e = ids[pair]."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    pair = tl.program_id(0).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rows < inter
    expert = tl.load(ids_ptr + pair).to(tl.int64)
    gate_rows = w_ptr + expert * stride_we + tl.where(n_mask, rows, 0).to(tl.int64)[:, None] * stride_wn
    up_rows = gate_rows + inter * stride_wn
    x_row = x_ptr + (pair // X_ROW_DIV) * stride_xm
    ks = tl.arange(0, BLOCK_K)
    gate = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    up = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in tl.static_range(0, K, BLOCK_K):
        k = k0 + ks
        k_mask = (k < K)[None, :]
        x = tl.load(x_row + k, mask=k < K, other=0.0).to(tl.float32)[None, :]
        gate += tl.load(gate_rows + k[None, :], mask=k_mask, other=0.0).to(tl.float32) * x
        up += tl.load(up_rows + k[None, :], mask=k_mask, other=0.0).to(tl.float32) * x
    g = tl.sum(gate, axis=1)
    act = g * tl.sigmoid(g) * tl.sum(up, axis=1)
    tl.store(out_ptr + pair * inter + rows, act.to(out_ptr.dtype.element_ty), mask=n_mask)


@triton.jit
def _down_kernel(mid_ptr, w_ptr, ids_ptr, weights_ptr, out_ptr, N, stride_we, stride_wn, K: tl.constexpr,
                 TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    """out[t, n] = sum over j of weights[p] * (mid[p] . W_e[n]), p = t * TOP_K + j, e = ids[p]."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    token = tl.program_id(0).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rows < N
    row_offsets = tl.where(n_mask, rows, 0).to(tl.int64)[:, None] * stride_wn
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        pair = token * TOP_K + j
        w_rows = w_ptr + tl.load(ids_ptr + pair).to(tl.int64) * stride_we + row_offsets
        part = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        for k0 in tl.static_range(0, K, BLOCK_K):
            k = k0 + ks
            w = tl.load(w_rows + k[None, :], mask=(k < K)[None, :], other=0.0)
            if PDL and j == 0 and k0 == 0:
                tl.extra.cuda.gdc_wait()
            mid = tl.load(mid_ptr + pair * K + k, mask=k < K, other=0.0).to(tl.float32)
            part += w.to(tl.float32) * mid[None, :]
        acc += part * tl.load(weights_ptr + pair)
    tl.store(out_ptr + token * N + rows, tl.sum(acc, axis=1).to(out_ptr.dtype.element_ty), mask=n_mask)


def _step(block_k: int, k: int) -> int:
    return min(block_k, triton.next_power_of_2(k))


def gemv_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                 topk_ids: torch.Tensor, gate_up_config: tuple[int, int, int] | None = None,
                 down_config: tuple[int, int, int] | None = None) -> torch.Tensor:
    """fused_experts (wick/kernels/fused_moe.py) over float experts by the two GEMVs: x [T, H]; w13 [E, 2I, H] (gate
    rows, then up rows) and w2 [E, H, I] in x's dtype, their rows contiguous; topk_weights [T, k], topk_ids [T, k].
    The configs: (rows a program, columns a step, warps) of each GEMV, for benchmarks; None picks them."""
    tokens, hidden = x.shape
    top_k = topk_ids.shape[1]
    inter = w2.shape[2]
    out = torch.empty(tokens, hidden, dtype=x.dtype, device=x.device)
    if tokens == 0:
        return out
    ids = topk_ids.reshape(-1).contiguous()
    weights = topk_weights.reshape(-1).to(torch.float32).contiguous()
    x = x if x.stride(-1) == 1 else x.contiguous()
    mid = torch.empty(ids.numel(), inter, dtype=x.dtype, device=x.device)
    block_n, block_k, warps = gate_up_config or GATE_UP_CONFIG
    _gate_up_kernel[(ids.numel(), triton.cdiv(inter, block_n))](
        x, w13, ids, mid, inter, x.stride(0), w13.stride(0), w13.stride(1), K=hidden, X_ROW_DIV=top_k,
        BLOCK_N=block_n, BLOCK_K=_step(block_k, hidden), num_warps=warps, **pdl_options(x))
    block_n, block_k, warps = down_config or DOWN_CONFIG
    _down_kernel[(tokens, triton.cdiv(hidden, block_n))](
        mid, w2, ids, weights, out, hidden, w2.stride(0), w2.stride(1), K=inter, TOP_K=top_k, BLOCK_N=block_n,
        BLOCK_K=_step(block_k, inter), num_warps=warps, **pdl_options(x))
    return out
