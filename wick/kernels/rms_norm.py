"""RMSNorm in one kernel, optionally fused with the residual add before it, with a first RMSNorm of the added x
(Gemma's and GLM-4's norm of a sublayer's output before the residual add), and with the sum of an MoE layer's pairs
that makes that x (pair_sum.PairRows).

The arithmetic follows wick.layers.norm.RMSNorm step by step, rounding where its torch ops round: the
sum x + residual is rounded to the input dtype, the variance and scaling are fp32, the scaled row is
rounded to the input dtype before the weight multiplies it. Results equal the torch path but where the
variance's different order of summation tips a rounding: on an H200 in bf16, a few elements in a
million, by one or two ulps.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from wick.kernels.int8_activations import Int8Rows, int8_rows_like, store_runs
from wick.kernels.pair_sum import PairRows, pair_sum
from wick.kernels.pdl import pdl_options, pdl_prologue


class RowNorm(NamedTuple):
    """An RMSNorm of one row that the kernel reading the row applies first (the batch-1 float GEMV):
    rms_norm(x + residual) * weight, rounded where this module's kernel rounds. That kernel writes x + residual
    to residual_out and the normed row to normed_out (both contiguous, in x's dtype), for what reads them later."""

    weight: torch.Tensor
    eps: float
    residual: torch.Tensor
    residual_out: torch.Tensor
    normed_out: torch.Tensor


# elements one program normalizes: small rows (per-head q/k norms) are packed several to a program
_ELEMENTS_PER_PROGRAM = 2048


@triton.jit
def scale_row(x, rstd, weight):
    """x in its dtype times rstd, rounded to that dtype, times weight, in fp32: the norm's rounding (shapes
    broadcast), which a kernel applying a RowNorm shares."""
    return (x.to(tl.float32) * rstd).to(x.dtype).to(tl.float32) * weight.to(tl.float32)


@triton.jit
def normalize_rows(x, weight_ptr, cols, eps, D: tl.constexpr):
    """x [rows, BLOCK_D] in its dtype -> rms_norm(x) * weight in fp32, the scaled row rounded to x's dtype."""
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=1) / D + eps)
    return scale_row(x, rstd[:, None], tl.load(weight_ptr + cols, mask=cols < D, other=0.0)[None, :])


@triton.jit(do_not_specialize=["num_rows"])
def _rms_norm_kernel(
    x_ptr, residual_ptr, residual_out_ptr, weight_ptr, out_ptr, x_weight_ptr, q_ptr, d_ptr, s_ptr, pair_weights_ptr,
    num_rows, heads, stride_xt, stride_xh, stride_xd, stride_rt, stride_rh, stride_rd, eps, x_eps,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_ROWS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    X_NORM: tl.constexpr, QUANTIZE: tl.constexpr, INTERLEAVE: tl.constexpr, TOP_K: tl.constexpr, PDL: tl.constexpr,
):
    """Where QUANTIZE (one row a program) the normed row is also rounded to int8 (int8_activations.store_runs). Where
    TOP_K (rows of one head) x's row t is the sum of an MoE layer's pairs t * TOP_K + j at x_ptr, contiguous, each
    times its weight (pair_sum.pair_sum), rounded to x's dtype."""
    pdl_prologue(PDL)
    rows = (tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    mask = (rows < num_rows)[:, None] & (cols < D)[None, :]
    token, head = rows // heads, rows % heads
    if TOP_K > 0:
        x = pair_sum(x_ptr, pair_weights_ptr, rows, rows < num_rows, cols, cols < D, D, TOP_K, True)
        x = x.to(x_ptr.dtype.element_ty)
    else:
        x_offsets = (token * stride_xt + head * stride_xh)[:, None] + cols[None, :] * stride_xd
        x = tl.load(x_ptr + x_offsets, mask=mask, other=0.0)
    if X_NORM:
        x = normalize_rows(x, x_weight_ptr, cols, x_eps, D).to(x_ptr.dtype.element_ty)
    if HAS_RESIDUAL:
        r_offsets = (token * stride_rt + head * stride_rh)[:, None] + cols[None, :] * stride_rd
        residual = tl.load(residual_ptr + r_offsets, mask=mask, other=0.0)
        x = (x.to(tl.float32) + residual.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(residual_out_ptr + r_offsets, x, mask=mask)
    out = normalize_rows(x, weight_ptr, cols, eps, D).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + rows[:, None] * D + cols[None, :], out, mask=mask)
    if QUANTIZE:
        runs = tl.reshape(out.to(tl.float32), [BLOCK_D // 32, 32])
        row = tl.program_id(0).to(tl.int64)
        store_runs(runs, q_ptr + row * D, d_ptr + row * (D // 32), s_ptr + row * (D // 32),
                   tl.arange(0, BLOCK_D // 32), D, INTERLEAVE)


def _as_heads(x: torch.Tensor) -> torch.Tensor:
    """[T, D] -> [T, 1, D] and [T, H, D] as is, as views; more leading dims are flattened into T."""
    return x.unsqueeze(1) if x.dim() == 2 else x.flatten(0, -3)


def _launch(x: torch.Tensor | PairRows, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
            x_norm: tuple[torch.Tensor, float] | None = None, residual_out: torch.Tensor | None = None,
            out: torch.Tensor | None = None, int8_out: Int8Rows | None = None, interleave: bool = False
            ) -> torch.Tensor:
    if out is None:
        out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    pairs = x if isinstance(x, PairRows) else None
    if pairs is not None:
        if not (pairs.rows.is_contiguous() and pairs.weights.is_contiguous()
                and pairs.rows.shape[0] == pairs.weights.numel()):
            raise ValueError("MoE pairs are summed from rows [T * top_k, N] and weights [T, top_k], contiguous")
        x = pairs.rows[:pairs.shape[0]]  # stands for the sums [T, N] (shape, strides); the kernel reads the pairs
    x3 = _as_heads(x)
    r3 = x3 if residual is None else _as_heads(residual)
    r3_out = r3 if residual_out is None else _as_heads(residual_out)
    if r3_out.stride() != r3.stride():
        raise ValueError(f"residual_out's strides {r3_out.stride()} must be the residual's {r3.stride()}")
    tokens, heads, dim = x3.shape
    num_rows = tokens * heads
    if num_rows == 0:
        return out
    block_d = triton.next_power_of_2(dim)
    block_rows = 1 if int8_out else max(1, _ELEMENTS_PER_PROGRAM // block_d)
    x_weight, x_eps = x_norm or (weight, eps)
    _rms_norm_kernel[(triton.cdiv(num_rows, block_rows),)](
        x3, r3, r3_out, weight, out, x_weight, *(int8_out or (out, out, out)), out if pairs is None else pairs.weights,
        num_rows, heads, *x3.stride(), *r3.stride(), eps, x_eps,
        D=dim, BLOCK_D=block_d, BLOCK_ROWS=block_rows, HAS_RESIDUAL=residual is not None, X_NORM=x_norm is not None,
        QUANTIZE=int8_out is not None, INTERLEAVE=interleave, TOP_K=0 if pairs is None else pairs.weights.shape[1],
        # with int8_out the int8 GEMV after it is released only after its wait (pdl.py)
        num_warps=min(16, max(1, block_rows * block_d // 256)), **pdl_options(x, before_int8_gemv=int8_out is not None),
        # a product and the sum after its rounding contracted into one fma would skip the rounding the
        # unfused kernels make (16% of a bf16 residual's elements differed on an H100 with contraction on)
        enable_fp_fusion=False,
    )
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of x [..., D] (any strides, e.g. a [T, H, D] view for per-head norms).

    Returns a new contiguous tensor of x's shape in the promoted dtype of x and weight.
    """
    return _launch(x, None, weight, eps)


def fused_add_rms_norm(
    x: torch.Tensor | PairRows, residual: torch.Tensor, weight: torch.Tensor, eps: float,
    x_norm: tuple[torch.Tensor, float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """residual += x in place (rounded to x's dtype); returns (rms_norm(residual), residual).
    x_norm: (weight, eps) of an RMSNorm applied to x first (the weight in x's dtype). x may be an MoE layer's pairs,
    summed as they load."""
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(f"residual {residual.dtype}{list(residual.shape)} must match x {x.dtype}{list(x.shape)}")
    if x_norm is not None and x_norm[0].dtype != x.dtype:
        raise ValueError(f"x's norm weight {x_norm[0].dtype} must be in x's dtype {x.dtype}")
    return _launch(x, residual, weight, eps, x_norm), residual


def row_norm(x: torch.Tensor | PairRows, norm: RowNorm) -> torch.Tensor:
    """The norm's rows by this module's kernel, out of place: x + norm.residual into norm.residual_out, its RMSNorm
    into norm.normed_out, which is returned."""
    return _launch(x, norm.residual, norm.weight, norm.eps, residual_out=norm.residual_out, out=norm.normed_out)


def row_norm_q8(x: torch.Tensor | PairRows, norm: RowNorm, interleave: bool = False) -> Int8Rows:
    """row_norm's, and the normed rows rounded to int8 as int8_activations.quantize_q8(normed, interleave) rounds
    them, by the same kernel (x [M, D], D a multiple of 32)."""
    int8_out = int8_rows_like(norm.residual.reshape(-1, norm.residual.shape[-1]))
    _launch(x, norm.residual, norm.weight, norm.eps, residual_out=norm.residual_out, out=norm.normed_out,
            int8_out=int8_out, interleave=interleave)
    return int8_out


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Pure-torch reference of rms_norm."""
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def fused_add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure-torch reference of fused_add_rms_norm, out of place."""
    residual = x + residual
    return rms_norm_ref(residual, weight, eps), residual
