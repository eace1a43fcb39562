"""x @ W^T for W in float8 (e4m3) with float32 scales over [BLOCK_SN, BLOCK_SK] tiles of W: 128 x 128 for
block-scaled checkpoints (DeepSeek-V3, Qwen3-*-FP8), 1 x K for one scale per output row. The fp8 bytes
are read once and scaled inside the tile before tl.dot (W8A16: the activations stay in their dtype).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wick.kernels.activation import gated_gemv_output, gated_gemv_rows, gated_gemv_shape
from wick.kernels.gemv_split import fit_grid_rows
from wick.kernels.pdl import pdl_options


def fp8_dequantize(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """The reference: W [N, K] in float32, each scale covering a block[0] x block[1] tile."""
    n, k = weight.shape
    expanded = scale.repeat_interleave(block[0], 0)[:n].repeat_interleave(block[1], 1)[:, :k]
    return weight.float() * expanded


def scales_per_row(block: tuple[int, int], k: int) -> bool:
    """Whether scale tiles of `block` over a W of k columns are one scale a row."""
    return block[0] == 1 and block[1] >= k


@triton.jit
def _fp8_row_kernel(
    x_ptr, w_ptr, scale_ptr, out_ptr, N, K, stride_xm, stride_wn, stride_sn, stride_sk, stride_om,
    BLOCK_SN: tl.constexpr, BLOCK_SK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One row of x against BLOCK_N rows of W, any scale tiles (each weight scaled before the product)."""
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = cols < N
    ks = tl.arange(0, BLOCK_K)
    x_row = x_ptr + tl.program_id(0).to(tl.int64) * stride_xm
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + ks
        k_mask = k < K
        mask = n_mask[:, None] & k_mask[None, :]
        w = tl.load(w_ptr + cols.to(tl.int64)[:, None] * stride_wn + k[None, :], mask=mask, other=0.0)
        scale = tl.load(scale_ptr + (cols // BLOCK_SN)[:, None] * stride_sn + (k // BLOCK_SK)[None, :] * stride_sk,
                        mask=mask, other=0.0)
        x = tl.load(x_row + k, mask=k_mask, other=0.0).to(tl.float32)
        acc += tl.sum(w.to(tl.float32) * scale * x[None, :], axis=1)
    tl.store(out_ptr + tl.program_id(0).to(tl.int64) * stride_om + cols, acc.to(out_ptr.dtype.element_ty), mask=n_mask)


@triton.jit(do_not_specialize=["M"])
def _fp8_tile_kernel(
    x_ptr, w_ptr, scale_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_sn, stride_sk, stride_om,
    BLOCK_SN: tl.constexpr, BLOCK_SK: tl.constexpr, PER_ROW: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """out^T tile [BLOCK_N, BLOCK_M] = W tile @ x^T: the fp8 W tile, converted in registers (exactly: e4m3 fits
    in bf16), is the wide operand and the few rows of x the narrow one. The scale multiplies each BLOCK_K step's
    product (BLOCK_K divides BLOCK_SK), or, with one scale a row (PER_ROW), the sum once."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = cols < N
    m_mask = rows < M
    ks = tl.arange(0, BLOCK_K)
    scale_row = scale_ptr + tl.where(n_mask, cols // BLOCK_SN, 0) * stride_sn
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + ks
        k_mask = k < K
        w = tl.load(w_ptr + cols.to(tl.int64)[:, None] * stride_wn + k[None, :],
                    mask=n_mask[:, None] & k_mask[None, :], other=0.0).to(x_ptr.dtype.element_ty)
        xt = tl.load(x_ptr + rows.to(tl.int64)[None, :] * stride_xm + k[:, None],
                     mask=k_mask[:, None] & m_mask[None, :], other=0.0)
        if PER_ROW:
            acc = tl.dot(w, xt, acc, input_precision=DOT_PRECISION, out_dtype=tl.float32)
        else:
            scale = tl.load(scale_row + (k0 // BLOCK_SK) * stride_sk)
            acc += tl.dot(w, xt, input_precision=DOT_PRECISION, out_dtype=tl.float32) * scale[:, None]
    if PER_ROW:
        acc *= tl.load(scale_row)[:, None]
    out = out_ptr + rows.to(tl.int64)[None, :] * stride_om + cols[:, None]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=n_mask[:, None] & m_mask[None, :])


@triton.jit
def _fp8_gemv_step(acc, w, x_row, scale_row, k0, ks, K, stride_sk, BLOCK_SK: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, GROUPS: tl.constexpr):
    """acc plus the step from column k0 of W's rows (w, loaded) against x, scaled."""
    k = k0 + ks
    x = tl.load(x_row + k, mask=k < K, other=0.0).to(tl.float32)
    if GROUPS == 1:
        acc += tl.load(scale_row + (k0 // BLOCK_SK) * stride_sk) * tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    else:
        sums = tl.sum(tl.reshape(w.to(tl.float32) * x[None, :], [BLOCK_N, GROUPS, BLOCK_K // GROUPS]), axis=2)
        tiles = k0 // BLOCK_SK + tl.arange(0, GROUPS)
        scale = tl.load(scale_row[:, None] + tiles[None, :] * stride_sk, mask=(tiles * BLOCK_SK < K)[None, :],
                        other=0.0)
        acc += tl.sum(sums * scale, axis=1)
    return acc


@triton.jit
def _fp8_gemv_kernel(
    x_ptr, w_ptr, scale_ptr, out_ptr, experts_ptr, N, K, stride_xm, stride_we, stride_wn, stride_se, stride_sn,
    stride_sk, stride_om,
    BLOCK_SN: tl.constexpr, BLOCK_SK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUPS: tl.constexpr, X_ROW_DIV: tl.constexpr, EXPERTS: tl.constexpr, ACT: tl.constexpr, PDL: tl.constexpr,
):
    """Output row m against BLOCK_N rows of W, BLOCK_K columns a step: GROUPS scale tiles of BLOCK_K / GROUPS columns
    each (a tile a step: each row's sum over the step takes its scale once; several: the sums of each tile's
    columns take theirs). Row m reads row m // X_ROW_DIV of x; EXPERTS: W and the scales of expert experts[m] of
    stacked [E, N, K] ones (MoE experts, a (token, expert) pair a row). Where ACT >= 0 W holds 2N rows, gate rows
    then up rows, and the program takes BLOCK_N of each and writes act(gate) * up, as dense_gemv does. Where PDL
    (pdl.py) the first step's weights load while the kernel before ends."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    m = tl.program_id(0)
    if EXPERTS:
        expert = tl.load(experts_ptr + m).to(tl.int64)
        w_ptr += expert * stride_we
        scale_ptr += expert * stride_se
    halves: tl.constexpr = 2 if ACT >= 0 else 1
    safe, rows, n_mask = gated_gemv_rows(tl.program_id(1), N, BLOCK_N, ACT)
    ks = tl.arange(0, BLOCK_K)
    x_row = x_ptr + (m // X_ROW_DIV).to(tl.int64) * stride_xm
    scale_row = scale_ptr + (safe // BLOCK_SN) * stride_sn
    w_rows = w_ptr + safe.to(tl.int64)[:, None] * stride_wn
    w = tl.load(w_rows + ks[None, :], mask=(ks < K)[None, :], other=0.0)
    if PDL:
        tl.extra.cuda.gdc_wait()
    acc = _fp8_gemv_step(tl.zeros([halves * BLOCK_N], dtype=tl.float32), w, x_row, scale_row, 0, ks, K, stride_sk,
                         BLOCK_SK, halves * BLOCK_N, BLOCK_K, GROUPS)
    for k0 in range(BLOCK_K, K, BLOCK_K):
        k = k0 + ks
        w = tl.load(w_rows + k[None, :], mask=(k < K)[None, :], other=0.0)
        acc = _fp8_gemv_step(acc, w, x_row, scale_row, k0, ks, K, stride_sk, BLOCK_SK, halves * BLOCK_N, BLOCK_K,
                             GROUPS)
    acc, rows, n_mask = gated_gemv_output(acc, tl.program_id(1), N, out_ptr, BLOCK_N, ACT)
    tl.store(out_ptr + m.to(tl.int64) * stride_om + rows, acc.to(out_ptr.dtype.element_ty), mask=n_mask)


def _gemv_steps(block: tuple[int, int], k: int, block_k: int) -> tuple[int, int] | None:
    """(BLOCK_K, GROUPS) of the GEMV over K = k with scale tiles `block`: a step inside one scale tile, or over
    GROUPS whole ones (power-of-two tiles); None if neither fits (the row kernel then scales each weight)."""
    if block[1] >= k:
        return block_k, 1
    if block[1] & (block[1] - 1) == 0:
        return (block_k, block_k // block[1]) if block_k >= block[1] else (block_k, 1)
    block_k = min(block_k, 1 << (block[1].bit_length() - 1))
    return (block_k, 1) if block[1] % block_k == 0 else None


GEMV_MAX_ROWS = 8
# Rows per program, columns per step (at most K's next power of two) and warps of the GEMV
# (benchmarks/kernels/bench_quant_gemv.py --formats fp8 --sweep, Llama-3.1-8B's layers on an H200: 58.3 us a layer
# against 65.6 at the H100's choice (2, 2048, 4)).
FP8_GEMV_CONFIG = (4, 2048, 2)
# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) of the tile kernel by the most rows they serve; 32 and 128 rows
# from `benchmarks/kernels/bench_fp8_gemm.py --sweep` on an H100; past the last, the last.
FP8_TILE_CONFIGS: list[tuple[int, tuple[int, int, int, int, int]]] = [
    (16, (16, 128, 128, 4, 4)),
    (32, (32, 128, 128, 8, 4)),
    (64, (64, 128, 128, 4, 3)),
    (1 << 62, (128, 128, 64, 8, 4)),
]


def fp8_matmul(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
               gemv_config: tuple[int, int, int] | None = None,
               tile_config: tuple[int, int, int, int, int] | None = None) -> torch.Tensor:
    """x [..., K] @ W^T -> [..., N] in x's dtype; W [N, K] float8, scale [ceil(N / block[0]), ceil(K / block[1])].
    gemv_config: (rows, columns a step, warps) of the GEMV; tile_config: (BLOCK_M, BLOCK_N, BLOCK_K, warps,
    stages) of the tile kernel; for benchmarks, None picks them."""
    n, k = weight.shape
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out.reshape(*x.shape[:-1], n)
    args = (x2, weight, scale, out)
    strides = (x2.stride(0), weight.stride(0), scale.stride(0), scale.stride(1), out.stride(0))
    per_row = scales_per_row(block, k)
    if m > GEMV_MAX_ROWS:
        block_m, block_n, block_k, warps, stages = tile_config or next(c for rows, c in FP8_TILE_CONFIGS if m <= rows)
        if not per_row:
            block_k = min(block_k, 1 << (block[1].bit_length() - 1))
        if per_row or block[1] % block_k == 0:
            _fp8_tile_kernel[(triton.cdiv(m, block_m), triton.cdiv(n, block_n))](
                *args, m, n, k, *strides, BLOCK_SN=block[0], BLOCK_SK=block[1], PER_ROW=per_row,
                BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", num_warps=warps, num_stages=stages)
            return out.reshape(*x.shape[:-1], n)
    if fp8_gemv(x2, weight, scale, block, out=out, gemv_config=gemv_config) is None:
        _fp8_row_kernel[(m, triton.cdiv(n, 32))](*args, n, k, *strides, BLOCK_SN=block[0], BLOCK_SK=block[1],
                                                 BLOCK_N=32, BLOCK_K=128)
    return out.reshape(*x.shape[:-1], n)


def fp8_gemv(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
             activation: str | None = None, out: torch.Tensor | None = None,
             gemv_config: tuple[int, int, int] | None = None) -> torch.Tensor | None:
    """x [M, K] (a unit last stride; a program a row) @ W^T -> [M, N] by the GEMV, as fp8_matmul's arguments;
    None where it has no steps over `block` (fp8_matmul's row kernel runs those). activation: an
    activation.ACTIVATIONS name: W's rows are gate rows then up rows, and the result act(gate) * up [M, N / 2]."""
    m, k = x.shape
    n, act = gated_gemv_shape(weight.shape[0], activation)
    block_n, block_k, warps = gemv_config or FP8_GEMV_CONFIG
    block_n = fit_grid_rows(n, block_n)
    steps = _gemv_steps(block, k, min(block_k, triton.next_power_of_2(k)))
    if steps is None:
        return None
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    _fp8_gemv_kernel[(m, triton.cdiv(n, block_n))](
        x, weight, scale, out, out, n, k, x.stride(0), 0, weight.stride(0), 0, scale.stride(0), scale.stride(1),
        out.stride(0), BLOCK_SN=block[0], BLOCK_SK=block[1], BLOCK_N=block_n, BLOCK_K=steps[0], GROUPS=steps[1],
        X_ROW_DIV=1, EXPERTS=False, ACT=act, num_warps=warps, **pdl_options(x))
    return out


# Rows per program, the most columns a step and warps of the expert GEMV; the step is the one of 256, 512 and 1,024
# columns that pads K least (Qwen3-30B-A3B's experts on an H100, 8 pairs: gate/up 11.0 us at (8, 1024, 2), 12.0 at
# the dense (4, 1024, 2); down, K = 768, 7.0 us at (8, 256, 2), 8.0 at (4, 1024, 2)).
EXPERT_GEMV_CONFIG = (8, 1024, 2)


def _expert_step(k: int, most: int) -> int:
    """Of the steps 256 .. `most` columns (powers of two), the one whose last step over k pads least, the widest of
    those."""
    steps = [step for step in (1024, 512, 256) if step <= most] or [most]
    return min(steps, key=lambda step: -k % step)


def runs_expert_gemv(block: tuple[int, int], k: int) -> bool:
    """Whether fp8_expert_gemv takes experts over k columns with scale tiles `block`."""
    return _gemv_steps(block, k, _expert_step(k, EXPERT_GEMV_CONFIG[1])) is not None


def fp8_expert_gemv(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
                    experts: torch.Tensor, x_row_div: int, gemv_config: tuple[int, int, int] | None = None,
                    activation: str | None = None) -> torch.Tensor:
    """out [P, N]: row p = x[p // x_row_div] @ W_{experts[p]}^T for experts `weight` [E, N, K] in float8 with scales
    [E, ceil(N / block[0]), ceil(K / block[1])], where runs_expert_gemv(block, K); with `activation` (an
    activation.ACTIVATIONS name) act(gate) * up [P, N / 2] of each expert's gate rows then up rows."""
    _, rows, k = weight.shape
    n, act = gated_gemv_shape(rows, activation)
    x2 = x.reshape(-1, k).contiguous()
    out = torch.empty(experts.numel(), n, dtype=x.dtype, device=x.device)
    block_n, block_k, warps = gemv_config or EXPERT_GEMV_CONFIG
    steps = _gemv_steps(block, k, block_k if gemv_config else _expert_step(k, block_k))
    if steps is None:
        raise ValueError(f"no fp8 GEMV steps {block_k} columns over scale tiles {block} of {k} columns")
    block_k, groups = steps
    if out.shape[0]:
        _fp8_gemv_kernel[(out.shape[0], triton.cdiv(n, block_n))](
            x2, weight, scale, out, experts, n, k, x2.stride(0), weight.stride(0), weight.stride(1), scale.stride(0),
            scale.stride(1), scale.stride(2), out.stride(0), BLOCK_SN=block[0], BLOCK_SK=block[1], BLOCK_N=block_n,
            BLOCK_K=block_k, GROUPS=groups, X_ROW_DIV=x_row_div, EXPERTS=True, ACT=act, PDL=False,
            num_warps=warps)
    return out
