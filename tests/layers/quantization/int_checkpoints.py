"""Test helper: our round-to-nearest quantizer writing GPTQ (v1) and AWQ (GEMM) checkpoint tensors,
with the float weights those tensors stand for."""

from __future__ import annotations

import torch

from wick.kernels.wna16_matmul import pack_rows
from wick.layers.quantization.awq import AWQ_ORDER


def _pack_columns(values: torch.Tensor, bits: int) -> torch.Tensor:
    return pack_rows(values.t().contiguous(), bits).t().contiguous()


def _fit(wt: torch.Tensor, g_idx: torch.Tensor, groups: int, bits: int, sym: bool, min_zero: int):
    """Scales (fp16 values) and integer zero points [groups, N] for wt [K, N]; q [K, N]."""
    maxq = (1 << bits) - 1
    scales, zeros = [], []
    for g in range(groups):
        rows = wt[g_idx == g]
        if sym:
            scale = 2 * rows.abs().amax(0) / maxq
            zero = torch.full_like(scale, (maxq + 1) // 2)
        else:
            low, high = rows.amin(0).clamp(max=0), rows.amax(0).clamp(min=0)
            scale = (high - low) / maxq
            zero = (-low / scale).round().clamp(min_zero, maxq)
        scales.append(scale.half().float())
        zeros.append(zero)
    scales, zeros = torch.stack(scales), torch.stack(zeros).long()
    q = ((wt / scales[g_idx]).round() + zeros[g_idx]).clamp(0, maxq).long()
    return scales, zeros, q


def gptq_tensors(w: torch.Tensor, bits: int, group: int, desc_act: bool, sym: bool,
                 perm: torch.Tensor | None) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """GPTQ tensors of an HF weight w [N, K] and the weight they dequantize to."""
    wt = w.t()
    k = wt.shape[0]
    group = k if group == -1 else group
    order = perm if desc_act else torch.arange(k)
    g_idx = torch.empty(k, dtype=torch.long)
    g_idx[order] = torch.arange(k) // group
    groups = -(-k // group)
    # v1 stores zero - 1 in unsigned bits, so a zero point of 0 cannot be written.
    scales, zeros, q = _fit(wt, g_idx, groups, bits, sym, min_zero=1)
    tensors = {"qweight": pack_rows(q, bits), "qzeros": _pack_columns(zeros - 1, bits),
               "scales": scales.half(), "g_idx": g_idx.to(torch.int32)}
    return tensors, ((q - zeros[g_idx]) * scales[g_idx]).t()


def awq_tensors(w: torch.Tensor, group: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """AWQ (GEMM) tensors of an HF weight w [N, K] and the weight they dequantize to."""
    wt = w.t()
    k = wt.shape[0]
    g_idx = torch.arange(k) // group
    scales, zeros, q = _fit(wt, g_idx, k // group, 4, sym=False, min_zero=0)

    def interleave(values: torch.Tensor) -> torch.Tensor:
        grouped = values.reshape(values.shape[0], -1, 8)
        return _pack_columns(grouped[..., list(AWQ_ORDER)].reshape(values.shape[0], -1), 4)

    tensors = {"qweight": interleave(q), "qzeros": interleave(zeros), "scales": scales.half()}
    return tensors, ((q - zeros[g_idx]) * scales[g_idx]).t()
