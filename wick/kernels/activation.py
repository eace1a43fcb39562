"""Gated activations in one kernel: [..., 2F] (gate, up side by side) -> act(gate) * up, [..., F], for SiLU
and GELU (tanh-approximated or exact).

As in wick.layers.activation, the activation is computed in fp32 and rounded to the input dtype before it
multiplies up, and the product is rounded again.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wick.kernels.int8_activations import Int8Rows, int8_rows_like, store_runs
from wick.kernels.pdl import pdl_options, pdl_prologue

_BLOCK = 1024
# The activations by name (the gated kernels' ACT values).
ACTIVATIONS = {"silu": 0, "gelu_tanh": 1, "gelu": 2}


def gated_gemv_shape(rows: int, activation: str | None) -> tuple[int, int]:
    """(output rows, ACT) of a GEMV over `rows` rows of W: all of them and -1, or with an ACTIVATIONS name half of
    them (gate rows, then up rows) and its ACT value."""
    if activation is None:
        return rows, -1
    if rows % 2:
        raise ValueError(f"a gated GEMV needs an even number of rows (gate, up), got {rows}")
    return rows // 2, ACTIVATIONS[activation]


@triton.jit
def gated_activation(gate, up, ACT: tl.constexpr):
    """act(gate) * up in float32 from gate and up in a float dtype, act rounded to that dtype first (as
    wick.layers.activation does); ACT an ACTIVATIONS value."""
    dtype = gate.dtype
    gate = gate.to(tl.float32)
    if ACT == 0:
        act = gate / (1.0 + tl.exp(-gate))
    elif ACT == 1:
        # torch's 0.5 x (1 + tanh(y)), y = sqrt(2 / pi) (x + 0.044715 x^3), tanh(|y|) as 1 - 2 / (e^2|y| + 1):
        # the algebraically equal x sigmoid(2y) would not round as torch's cancellation in 1 + tanh does
        y = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        tanh_abs = 1.0 - 2.0 / (tl.exp(2.0 * tl.abs(y)) + 1.0)
        act = 0.5 * gate * (1.0 + tl.where(y < 0, -tanh_abs, tanh_abs))
    else:
        act = 0.5 * gate * (1.0 + tl.erf(gate * 0.7071067811865476))
    return act.to(dtype).to(tl.float32) * up.to(tl.float32)


@triton.jit
def gated_gemv_rows(tile, N, BLOCK_N: tl.constexpr, ACT: tl.constexpr):
    """The rows of W a GEMV program `tile` reads and their output rows and mask: BLOCK_N of N, or where ACT >= 0
    (gated: W holds N gate rows then N up rows) those rows of both halves, 2 * BLOCK_N."""
    halves: tl.constexpr = 2 if ACT >= 0 else 1
    local = tl.arange(0, halves * BLOCK_N)
    rows = tile * BLOCK_N + local % BLOCK_N
    n_mask = rows < N
    return tl.where(n_mask, rows, 0) + local // BLOCK_N * N, rows, n_mask


@triton.jit
def gated_gemv_output(sums, tile, N, out_ptr, BLOCK_N: tl.constexpr, ACT: tl.constexpr):
    """A GEMV program's sums over gated_gemv_rows' rows -> (its outputs, their rows, their mask): the sums, or
    where ACT >= 0 act(gate) * up from the gate and up halves, each rounded to out's dtype first (as a GEMV and
    this module's kernel after it would)."""
    rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    if ACT >= 0:
        dtype = out_ptr.dtype.element_ty
        gate, up = tl.split(tl.permute(tl.reshape(sums, [2, BLOCK_N]), [1, 0]))
        sums = gated_activation(gate.to(dtype), up.to(dtype), ACT)
    return sums, rows, rows < N


@triton.jit
def _act_and_mul_kernel(x_ptr, out_ptr, q_ptr, d_ptr, s_ptr, stride_x, features, ACT: tl.constexpr,
                        BLOCK: tl.constexpr, QUANTIZE: tl.constexpr, INTERLEAVE: tl.constexpr, PDL: tl.constexpr):
    """Where QUANTIZE the row is rounded to int8 instead of stored (int8_activations.store_runs)."""
    pdl_prologue(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < features
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + features + cols, mask=mask, other=0.0)
    out = gated_activation(gate, up, ACT).to(out_ptr.dtype.element_ty)
    if QUANTIZE:
        runs = tl.program_id(1) * (BLOCK // 32) + tl.arange(0, BLOCK // 32)
        store_runs(tl.reshape(out.to(tl.float32), [BLOCK // 32, 32]), q_ptr + row * features,
                   d_ptr + row * (features // 32), s_ptr + row * (features // 32), runs, features, INTERLEAVE)
    else:
        tl.store(out_ptr + row * features + cols, out, mask=mask)


def _act_and_mul(x: torch.Tensor, activation: str) -> torch.Tensor:
    width = x.shape[-1]
    if width % 2 or x.stride(-1) != 1:
        raise ValueError(f"{activation}_and_mul needs an even, contiguous last dim; got {width} with stride "
                         f"{x.stride(-1)}")
    features = width // 2
    out = torch.empty(*x.shape[:-1], features, dtype=x.dtype, device=x.device)
    rows = x.reshape(-1, width)
    if rows.shape[0] == 0:
        return out
    _act_and_mul_kernel[(rows.shape[0], triton.cdiv(features, _BLOCK))](
        rows, out, out, out, out, rows.stride(0), features, ACT=ACTIVATIONS[activation], BLOCK=_BLOCK,
        QUANTIZE=False, INTERLEAVE=False, num_warps=4, **pdl_options(x)
    )
    return out


def act_and_mul_q8(x: torch.Tensor, activation: str, interleave: bool = False) -> Int8Rows:
    """act(gate) * up of x [M, 2F] (an ACTIVATIONS name; F a multiple of 32) rounded to int8 as
    int8_activations.quantize_q8(its rows, interleave) rounds them, in one kernel, which releases the int8 GEMV
    after it only after its own wait (pdl.py)."""
    rows = x.reshape(-1, x.shape[-1])
    features = rows.shape[1] // 2
    int8_out = int8_rows_like(rows[:, :features])
    _act_and_mul_kernel[(rows.shape[0], triton.cdiv(features, _BLOCK))](
        rows, x, *int8_out, rows.stride(0), features, ACT=ACTIVATIONS[activation], BLOCK=_BLOCK, QUANTIZE=True,
        INTERLEAVE=interleave, num_warps=4, **pdl_options(x, before_int8_gemv=True))
    return int8_out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2F] with a unit last stride -> a new contiguous [..., F]."""
    return _act_and_mul(x, "silu")


def gelu_and_mul(x: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """x [..., 2F] with a unit last stride -> a new contiguous [..., F]; approximate "tanh" or "none"
    (torch.nn.functional.gelu's)."""
    return _act_and_mul(x, "gelu_tanh" if approximate == "tanh" else "gelu")


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """Pure-torch reference of silu_and_mul."""
    gate, up = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def gelu_and_mul_ref(x: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """Pure-torch reference of gelu_and_mul: GELU in fp32, as torch computes it on CUDA (its CPU half erf is
    coarser)."""
    gate, up = x.chunk(2, dim=-1)
    return torch.nn.functional.gelu(gate.float(), approximate=approximate).to(x.dtype) * up
