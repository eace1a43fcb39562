"""x @ W^T for W in float8 (e4m3) with float32 scales over [BLOCK_SN, BLOCK_SK] tiles of W: 128 x 128 for
block-scaled checkpoints (DeepSeek-V3, Qwen3-*-FP8), 1 x K for one scale per output row. The fp8 bytes
are read once and scaled inside the tile before tl.dot (W8A16: the activations stay in their dtype).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def fp8_dequantize(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """The reference: W [N, K] in float32, each scale covering a block[0] x block[1] tile."""
    n, k = weight.shape
    expanded = scale.repeat_interleave(block[0], 0)[:n].repeat_interleave(block[1], 1)[:, :k]
    return weight.float() * expanded


@triton.jit(do_not_specialize=["M"])
def _fp8_kernel(
    x_ptr, w_ptr, scale_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_sn, stride_sk, stride_om,
    BLOCK_SN: tl.constexpr, BLOCK_SK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GEMV: tl.constexpr,
):
    pid_m = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = cols < N
    ks = tl.arange(0, BLOCK_K)
    if GEMV:
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    else:
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + ks
        k_mask = k < K
        mask = n_mask[:, None] & k_mask[None, :]
        w = tl.load(w_ptr + cols.to(tl.int64)[:, None] * stride_wn + k[None, :], mask=mask, other=0.0)
        scale = tl.load(scale_ptr + (cols // BLOCK_SN)[:, None] * stride_sn + (k // BLOCK_SK)[None, :] * stride_sk,
                        mask=mask, other=0.0)
        w = w.to(tl.float32) * scale
        if GEMV:
            x = tl.load(x_ptr + pid_m.to(tl.int64) * stride_xm + k, mask=k_mask, other=0.0).to(tl.float32)
            acc += tl.sum(w * x[None, :], axis=1)
        else:
            x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_xm + k[None, :],
                        mask=(rows < M)[:, None] & k_mask[None, :], other=0.0)
            acc += tl.dot(x, tl.trans(w.to(x_ptr.dtype.element_ty)), out_dtype=tl.float32)
    if GEMV:
        tl.store(out_ptr + pid_m.to(tl.int64) * stride_om + cols, acc.to(out_ptr.dtype.element_ty), mask=n_mask)
    else:
        out = out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(rows < M)[:, None] & n_mask[None, :])


@triton.jit
def _fp8_gemv_kernel(
    x_ptr, w_ptr, scale_ptr, out_ptr, N, K, stride_xm, stride_wn, stride_sn, stride_sk, stride_om,
    BLOCK_SN: tl.constexpr, BLOCK_SK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One row of x against BLOCK_N rows of W, BLOCK_K columns a step inside one scale tile: each row's
    sum over the step takes its scale once."""
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rows < N
    safe = tl.where(n_mask, rows, 0)
    ks = tl.arange(0, BLOCK_K)
    x_row = x_ptr + tl.program_id(0).to(tl.int64) * stride_xm
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + ks
        k_mask = k < K
        w = tl.load(w_ptr + safe.to(tl.int64)[:, None] * stride_wn + k[None, :], mask=k_mask[None, :], other=0.0)
        x = tl.load(x_row + k, mask=k_mask, other=0.0).to(tl.float32)
        scale = tl.load(scale_ptr + (safe // BLOCK_SN) * stride_sn + (k0 // BLOCK_SK) * stride_sk)
        acc += scale * tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    tl.store(out_ptr + tl.program_id(0).to(tl.int64) * stride_om + rows, acc.to(out_ptr.dtype.element_ty), mask=n_mask)


GEMV_MAX_ROWS = 8
# Rows per program, columns per step and warps of the GEMV (benchmarks/kernels/bench_quant_gemv.py).
FP8_GEMV_CONFIG = (4, 1024, 2)


def fp8_matmul(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
               gemv_config: tuple[int, int, int] | None = None) -> torch.Tensor:
    """x [..., K] @ W^T -> [..., N] in x's dtype; W [N, K] float8, scale [ceil(N / block[0]), ceil(K / block[1])].
    gemv_config: (rows, columns a step, warps) of the GEMV, for benchmarks; None picks them."""
    n, k = weight.shape
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out.reshape(*x.shape[:-1], n)
    gemv = m <= GEMV_MAX_ROWS
    block_n, block_k, warps = gemv_config or FP8_GEMV_CONFIG
    if block[1] < k:
        block_k = min(block_k, 1 << (block[1].bit_length() - 1))
    if gemv and (block[1] >= k or block[1] % block_k == 0):
        _fp8_gemv_kernel[(m, triton.cdiv(n, block_n))](
            x2, weight, scale, out, n, k, x2.stride(0), weight.stride(0), scale.stride(0), scale.stride(1),
            out.stride(0), BLOCK_SN=block[0], BLOCK_SK=block[1], BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps)
        return out.reshape(*x.shape[:-1], n)
    block_m = 1 if gemv else 16 if m <= 16 else 64
    block_n, block_k = (32, 128) if gemv else (64, 64)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _fp8_kernel[grid](x2, weight, scale, out, m, n, k, x2.stride(0), weight.stride(0), scale.stride(0),
                      scale.stride(1), out.stride(0), BLOCK_SN=block[0], BLOCK_SK=block[1],
                      BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GEMV=gemv)
    return out.reshape(*x.shape[:-1], n)
