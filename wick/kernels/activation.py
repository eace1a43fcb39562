"""SiLU-and-mul in one kernel: [..., 2F] (gate, up side by side) -> silu(gate) * up, [..., F].

As in wick.layers.activation.SiluAndMul, silu is computed in fp32 and rounded to the input dtype
before it multiplies up, and the product is rounded again.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, features, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < features
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + features + cols, mask=mask, other=0.0).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(x_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * features + cols, (silu * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2F] with a unit last stride -> a new contiguous [..., F]."""
    width = x.shape[-1]
    if width % 2 or x.stride(-1) != 1:
        raise ValueError(f"silu_and_mul needs an even, contiguous last dim; got {width} with stride {x.stride(-1)}")
    features = width // 2
    out = torch.empty(*x.shape[:-1], features, dtype=x.dtype, device=x.device)
    rows = x.reshape(-1, width)
    if rows.shape[0] == 0:
        return out
    _silu_and_mul_kernel[(rows.shape[0], triton.cdiv(features, _BLOCK))](
        rows, out, rows.stride(0), features, BLOCK=_BLOCK, num_warps=4
    )
    return out


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """Pure-torch reference of silu_and_mul."""
    gate, up = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up
