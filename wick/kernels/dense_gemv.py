"""x @ W^T (+ b) for one row of x and W in a float dtype, a batch-1 decode step's linear layer: BLOCK_N rows of W
a program, BLOCK_K columns a step, the products summed in float32. At batch 1 it is 1.07-1.8x faster than cuBLAS
at every layer of four models' shapes (docs/benchmarks.md, session 20); splitting K was no faster at any. Over a
merged gate/up projection it writes act(gate) * up itself, so no activation kernel runs between it and the down
projection. Given a RowNorm it norms x + the residual itself first, so no norm kernel runs between it and the
GEMV before, which pays where K is small (NORM_BELOW_K)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wick.kernels.activation import gated_gemv_output, gated_gemv_rows, gated_gemv_shape
from wick.kernels.pdl import pdl_options
from wick.kernels.rms_norm import RowNorm, scale_row

# (rows a program, columns a step, warps): the wide step where K is at least WIDE_FROM_K, or fills one wide step with at
# most FEW_ROWS rows of W; the narrow one elsewhere (a step wider than K loads masked columns). From
# `benchmarks/kernels/bench_quant_gemv.py --formats dense,dense_silu --sweep` over five models' layers on an H200: at
# K = 2,048 the wide step took 10-25% longer than two narrow ones (Qwen3-30B-A3B's qkv 7.0 against 6.0 us, its LM
# head 148.0 against 137.1) but over Qwen3-0.6B's 1,024 rows of o (2.0-2.1 against 2.5: a few programs, each wants
# more warps); from K = 4,096 on it is the best or as good.
WIDE_GEMV_CONFIG = (2, 2048, 8)
NARROW_GEMV_CONFIG = (2, 1024, 4)
WIDE_FROM_K = 4096
FEW_ROWS = 1024
# Where the GEMV takes its x's RMSNorm (takes_norm): below this K, or at most this many rows of W (a router's). A
# layer's GEMVs in CUDA graphs on an H200 (benchmarks/kernels/bench_norm_in_gemv.py, docs/benchmarks.md session
# 25), us a layer with the norms in the GEMVs against as kernels: 14.6 against 15.7 at K 1,024, 39.9 against 36.0
# at 2,048, 119.1 against 106.7 at 4,096: each program reads x and the residual twice, which costs more the more
# programs there are. A router's few programs gain (Qwen3-30B-A3B's decode graph 0.7% shorter).
NORM_BELOW_K = 2048
NORM_MAX_ROWS = 256


def takes_norm(n: int, k: int) -> bool:
    """Whether the GEMV over W [n, k] is to apply its x's RMSNorm itself (a RowNorm) rather than a kernel before."""
    return k < NORM_BELOW_K or n <= NORM_MAX_ROWS


def default_config(rows: int, k: int) -> tuple[int, int, int]:
    """(rows a program, columns a step, warps) of the GEMV over W [rows, k]."""
    wide = k >= WIDE_FROM_K or (k >= WIDE_GEMV_CONFIG[1] and rows <= FEW_ROWS)
    return WIDE_GEMV_CONFIG if wide else NARROW_GEMV_CONFIG


@triton.jit
def _added(x_ptr, residual_ptr, k, k_mask):
    """x + residual over columns k, rounded to x's dtype."""
    x = tl.load(x_ptr + k, mask=k_mask, other=0.0)
    return (x.to(tl.float32) + tl.load(residual_ptr + k, mask=k_mask, other=0.0).to(tl.float32)).to(x.dtype)


@triton.jit
def _row_rstd(x_ptr, residual_ptr, K, eps, BLOCK_K: tl.constexpr):
    ks = tl.arange(0, BLOCK_K)
    squares = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        h = _added(x_ptr, residual_ptr, k0 + ks, k0 + ks < K).to(tl.float32)
        squares += h * h
    return tl.rsqrt(tl.sum(squares, axis=0) / K + eps)


@triton.jit
def _gemv_input(x_ptr, residual_ptr, norm_ptr, residual_out_ptr, normed_out_ptr, k, k_mask, rstd,
                NORM: tl.constexpr):
    """x over columns k, or where NORM rms_norm(x + residual) * norm's weight (program 0 storing x + residual
    and the normed row)."""
    if not NORM:
        return tl.load(x_ptr + k, mask=k_mask, other=0.0)
    h = _added(x_ptr, residual_ptr, k, k_mask)
    normed = scale_row(h, rstd, tl.load(norm_ptr + k, mask=k_mask, other=0.0)).to(h.dtype)
    if tl.program_id(0) == 0:
        tl.store(residual_out_ptr + k, h, mask=k_mask)
        tl.store(normed_out_ptr + k, normed, mask=k_mask)
    return normed


@triton.jit
def _dense_gemv_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, N, K, stride_wn,
                       residual_ptr, norm_ptr, residual_out_ptr, normed_out_ptr, eps,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
                       NORM: tl.constexpr, PDL: tl.constexpr):
    """Where ACT >= 0 W holds 2N rows, gate rows then up rows, and the program takes BLOCK_N rows of each and
    writes act(gate) * up (activation.gated_gemv_output). Where NORM x is normed first (_gemv_input). Where PDL
    (pdl.py) the first step's weights load while the kernel before ends (nothing writes weights), x only after it
    has."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    w_index, rows, n_mask = gated_gemv_rows(tl.program_id(0), N, BLOCK_N, ACT)
    w_rows = w_ptr + w_index.to(tl.int64)[:, None] * stride_wn
    ks = tl.arange(0, BLOCK_K)
    w = tl.load(w_rows + ks[None, :], mask=(ks < K)[None, :], other=0.0)
    if PDL:
        tl.extra.cuda.gdc_wait()
    rstd = 1.0
    if NORM:
        rstd = _row_rstd(x_ptr, residual_ptr, K, eps, BLOCK_K)
    x = _gemv_input(x_ptr, residual_ptr, norm_ptr, residual_out_ptr, normed_out_ptr, ks, ks < K, rstd, NORM)
    acc = w.to(tl.float32) * x.to(tl.float32)[None, :]
    for k0 in range(BLOCK_K, K, BLOCK_K):
        k = k0 + ks
        k_mask = k < K
        w = tl.load(w_rows + k[None, :], mask=k_mask[None, :], other=0.0)
        x = _gemv_input(x_ptr, residual_ptr, norm_ptr, residual_out_ptr, normed_out_ptr, k, k_mask, rstd, NORM)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    total = tl.sum(acc, axis=1)
    if HAS_BIAS:
        total += tl.load(bias_ptr + w_index, mask=n_mask, other=0.0).to(tl.float32)
    total, rows, n_mask = gated_gemv_output(total, tl.program_id(0), N, out_ptr, BLOCK_N, ACT)
    tl.store(out_ptr + rows, total.to(out_ptr.dtype.element_ty), mask=n_mask)


def dense_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               config: tuple[int, int, int] | None = None, activation: str | None = None,
               norm: RowNorm | None = None) -> torch.Tensor:
    """x [..., K] holding one row @ weight [N, K]^T (+ bias [N]) -> [..., N] in x's dtype; weight's rows
    contiguous. activation: an activation.ACTIVATIONS name: weight (and bias) hold gate rows then up rows, and
    the result is act(gate) * up, [..., N / 2]. norm: an RMSNorm of x and its residual first, its weight in
    x's dtype. config: (rows a program, columns a step, warps), for benchmarks and tests; None: default_config's."""
    n, act = gated_gemv_shape(weight.shape[0], activation)
    k = weight.shape[1]
    x1 = x.reshape(k).contiguous()
    out = torch.empty(n, dtype=x.dtype, device=x.device)
    block_n, block_k, warps = config or default_config(weight.shape[0], k)
    norm_args = (out, out, out, out, 0.0) if norm is None else (
        norm.residual, norm.weight, norm.residual_out, norm.normed_out, norm.eps)
    _dense_gemv_kernel[(triton.cdiv(n, block_n),)](
        x1, weight, out if bias is None else bias, out, n, k, weight.stride(0), *norm_args, BLOCK_N=block_n,
        BLOCK_K=block_k, HAS_BIAS=bias is not None, ACT=act, NORM=norm is not None, num_warps=warps, **pdl_options(x),
        # compiled as kernels/rms_norm.py is, without fused multiply-adds, so the norm's squares sum as there
        enable_fp_fusion=norm is None)
    return out.reshape(*x.shape[:-1], n)
