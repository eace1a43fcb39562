"""Neox-style rotary embedding of q and k in one kernel, reading the cos/sin table at each position;
optionally each head RMS-normalized first (Qwen3's and Gemma 3's q/k norms), in the same kernel.

As in wick.layers.rotary.RotaryEmbedding, cos and sin are rounded to q's dtype and every product and
sum is rounded to it as the torch ops do, so the results equal the torch path bit for bit. The norm
rounds where wick.kernels.rms_norm does (the scaled head, then its product with the weight); the tests
hold the fused kernel within a rounding of the norm then the rotation.

Given a layer's paged caches, the kernel also writes each token's rotated k and its v into its slot, as
wick.kernels.kv_cache_write does (the attention backend then writes nothing): one launch fewer a layer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wick.kernels.kv_cache_write import FP8_DTYPES, KVCacheTarget, to_cache_values
from wick.kernels.pdl import pdl_options, pdl_prologue
from wick.kernels.rms_norm import scale_row


@triton.jit
def _rotate_heads(
    x_ptr, out_ptr, stride_xh, stride_xd, cos, sin, weight_ptr, eps, cache_ptr, cache_heads, inv_scale,
    NUM_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
    NORM: tl.constexpr, WRITE_CACHE: tl.constexpr, FP8: tl.constexpr,
):
    """Rotates one token's heads: x1, x2 (each head's halves) -> (x1 cos - x2 sin, x2 cos + x1 sin);
    NORM: x RMS-normalized over each head and scaled by weight first. WRITE_CACHE: the result also goes to
    cache_ptr (the token's slot, heads contiguous), its first cache_heads heads (all, or none)."""
    heads = tl.arange(0, HEADS_PAD)
    dims = tl.arange(0, HALF_PAD)
    mask = (heads < NUM_HEADS)[:, None] & (dims < HALF)[None, :]
    first = heads[:, None] * stride_xh + dims[None, :] * stride_xd
    x1 = tl.load(x_ptr + first, mask=mask, other=0.0)
    x2 = tl.load(x_ptr + first + HALF * stride_xd, mask=mask, other=0.0)
    dtype = x1.dtype
    x1, x2 = x1.to(tl.float32), x2.to(tl.float32)
    if NORM:
        rstd = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)[:, None]
        w1 = tl.load(weight_ptr + dims, mask=dims < HALF, other=0.0).to(tl.float32)[None, :]
        w2 = tl.load(weight_ptr + HALF + dims, mask=dims < HALF, other=0.0).to(tl.float32)[None, :]
        x1 = ((x1 * rstd).to(dtype).to(tl.float32) * w1).to(dtype).to(tl.float32)
        x2 = ((x2 * rstd).to(dtype).to(tl.float32) * w2).to(dtype).to(tl.float32)
    out1 = (x1 * cos).to(dtype).to(tl.float32) - (x2 * sin).to(dtype).to(tl.float32)
    out2 = (x2 * cos).to(dtype).to(tl.float32) + (x1 * sin).to(dtype).to(tl.float32)
    out_first = heads[:, None] * (2 * HALF) + dims[None, :]
    tl.store(out_ptr + out_first, out1.to(dtype), mask=mask)
    tl.store(out_ptr + out_first + HALF, out2.to(dtype), mask=mask)
    if WRITE_CACHE:
        mask = (heads < cache_heads)[:, None] & (dims < HALF)[None, :]
        tl.store(cache_ptr + out_first, to_cache_values(out1.to(dtype), cache_ptr, inv_scale, FP8), mask=mask)
        tl.store(cache_ptr + out_first + HALF, to_cache_values(out2.to(dtype), cache_ptr, inv_scale, FP8), mask=mask)


@triton.jit
def rotated_rows(row_ptrs, dims, mask, positions, cos_sin_ptr, stride_cache, weight_ptr, eps,
                 HEAD_DIM: tl.constexpr, NORM: tl.constexpr):
    """Heads at row_ptrs [R, 1] + dims [HEAD_DIM] (mask [R, 1]) rotated at positions [R, 1], each RMS-normalized by
    weight first where NORM, in their dtype, for a kernel that rotates the heads it reads (paged attention at decode):
    _rotate_heads' steps and roundings over a whole head at once, as x * [cos, cos] + x rolled by half a head *
    [-sin, sin]. The sum of squares runs over the whole head, and the attention kernel is compiled with fp contraction
    (the rotary kernel without), which fuses products into sums: the two may round a last bit apart."""
    HALF: tl.constexpr = HEAD_DIM // 2
    rolled = (dims + HALF) % HEAD_DIM
    x = tl.load(row_ptrs + dims[None, :], mask=mask, other=0.0)
    x_rolled = tl.load(row_ptrs + rolled[None, :], mask=mask, other=0.0)
    dtype = x.dtype
    xf, xr = x.to(tl.float32), x_rolled.to(tl.float32)
    if NORM:
        rstd = tl.rsqrt(tl.sum(xf * xf, axis=1, keep_dims=True) / HEAD_DIM + eps)
        xf = scale_row(x, rstd, tl.load(weight_ptr + dims)[None, :]).to(dtype).to(tl.float32)
        xr = scale_row(x_rolled, rstd, tl.load(weight_ptr + rolled)[None, :]).to(dtype).to(tl.float32)
    table = cos_sin_ptr + positions.to(tl.int64) * stride_cache + (dims % HALF)[None, :]
    cos = tl.load(table, mask=mask, other=0.0).to(dtype).to(tl.float32)
    sin = tl.load(table + HALF, mask=mask, other=0.0).to(dtype).to(tl.float32)
    sin = tl.where(dims[None, :] < HALF, -sin, sin)
    return ((xf * cos).to(dtype).to(tl.float32) + (xr * sin).to(dtype).to(tl.float32)).to(dtype)


@triton.jit
def _write_v(v_ptr, stride_vh, stride_vd, cache_ptr, cache_heads, inv_scale, NUM_HEADS: tl.constexpr,
             HEADS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, FP8: tl.constexpr):
    heads = tl.arange(0, HEADS_PAD)
    dims = tl.arange(0, HEAD_DIM_PAD)
    mask = (heads < cache_heads)[:, None] & (dims < HEAD_DIM)[None, :]
    v = tl.load(v_ptr + heads[:, None] * stride_vh + dims[None, :] * stride_vd, mask=mask, other=0.0)
    tl.store(cache_ptr + heads[:, None] * HEAD_DIM + dims[None, :], to_cache_values(v, cache_ptr, inv_scale, FP8),
             mask=mask)


@triton.jit
def _rotary_kernel(
    positions_ptr, cos_sin_ptr, q_ptr, k_ptr, q_out_ptr, k_out_ptr, q_weight_ptr, k_weight_ptr, eps,
    v_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr, k_inv_scale, v_inv_scale,
    stride_cache, stride_qt, stride_qh, stride_qd, stride_kt, stride_kh, stride_kd, stride_vt, stride_vh, stride_vd,
    stride_k_slot, stride_v_slot,
    NUM_Q_HEADS: tl.constexpr, Q_HEADS_PAD: tl.constexpr, NUM_K_HEADS: tl.constexpr, K_HEADS_PAD: tl.constexpr,
    HALF: tl.constexpr, HALF_PAD: tl.constexpr, NORM: tl.constexpr, WRITE_CACHE: tl.constexpr, FP8: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_prologue(PDL)
    token = tl.program_id(0).to(tl.int64)
    position = tl.load(positions_ptr + token).to(tl.int64)
    dims = tl.arange(0, HALF_PAD)
    cos = tl.load(cos_sin_ptr + position * stride_cache + dims, mask=dims < HALF, other=0.0)
    sin = tl.load(cos_sin_ptr + position * stride_cache + HALF + dims, mask=dims < HALF, other=0.0)
    dtype = q_ptr.dtype.element_ty
    cos = cos.to(dtype).to(tl.float32)[None, :]
    sin = sin.to(dtype).to(tl.float32)[None, :]
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64) if WRITE_CACHE else 0
    cache_heads = tl.where(slot >= 0, NUM_K_HEADS, 0)  # a slot < 0 is not written
    _rotate_heads(q_ptr + token * stride_qt, q_out_ptr + token * (NUM_Q_HEADS * 2 * HALF), stride_qh, stride_qd,
                  cos, sin, q_weight_ptr, eps, k_cache_ptr, 0, 1.0, NUM_Q_HEADS, Q_HEADS_PAD, HALF, HALF_PAD,
                  NORM, False, False)
    _rotate_heads(k_ptr + token * stride_kt, k_out_ptr + token * (NUM_K_HEADS * 2 * HALF), stride_kh, stride_kd,
                  cos, sin, k_weight_ptr, eps, k_cache_ptr + slot * stride_k_slot, cache_heads, k_inv_scale,
                  NUM_K_HEADS, K_HEADS_PAD, HALF, HALF_PAD, NORM, WRITE_CACHE, FP8)
    if WRITE_CACHE:
        _write_v(v_ptr + token * stride_vt, stride_vh, stride_vd, v_cache_ptr + slot * stride_v_slot, cache_heads,
                 v_inv_scale, NUM_K_HEADS, K_HEADS_PAD, 2 * HALF, 2 * HALF_PAD, FP8)


def rotary_embedding(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor,
    norm_weights: tuple[torch.Tensor, torch.Tensor] | None = None, eps: float = 1e-6,
    v: torch.Tensor | None = None, cache: KVCacheTarget | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [T]; q, k [T, heads * D] or [T, heads, D] of one dtype, any strides; cos_sin_cache
    [max_position, D] fp32 (cos for the D/2 frequencies, then sin). Returns new contiguous q, k, rotated.
    norm_weights: (q's, k's) [D] in q's dtype: each head is RMS-normalized (eps) and scaled by them first.
    v (k's shape) and cache: the rotated k and v are also written into the cache, as cache.write would.
    """
    if q.dtype != k.dtype:
        raise ValueError(f"q and k must share a dtype; got {q.dtype} and {k.dtype}")
    if norm_weights is not None and any(w.dtype != q.dtype for w in norm_weights):
        raise ValueError(f"the norm weights must be in q's dtype {q.dtype}")
    head_size = cos_sin_cache.shape[-1]
    num_tokens = positions.shape[0]
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if num_tokens == 0:
        return q_out, k_out
    q3, k3 = q.view(num_tokens, -1, head_size), k.view(num_tokens, -1, head_size)
    num_q_heads, num_k_heads = q3.shape[1], k3.shape[1]
    half = head_size // 2
    heads_pad = triton.next_power_of_2(num_q_heads) + triton.next_power_of_2(num_k_heads)
    q_weight, k_weight = norm_weights or (cos_sin_cache, cos_sin_cache)
    # without a cache, placeholders the kernel does not read
    v3, k_cache, v_cache, slots, k_scale, v_scale = k3, k_out, k_out, positions, 1.0, 1.0
    if cache is not None:
        v3 = v.view(num_tokens, -1, head_size)
        k_cache, v_cache, slots, k_scale, v_scale = (cache.k_cache, cache.v_cache, cache.slot_mapping, cache.k_scale,
                                                     cache.v_scale)
        if v3.shape != k3.shape or v3.stride(-1) != 1 or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
            raise ValueError("writing the cache needs v shaped as k, its heads contiguous, and contiguous caches")
    _rotary_kernel[(num_tokens,)](
        positions, cos_sin_cache, q3, k3, q_out, k_out, q_weight, k_weight, eps,
        v3, k_cache, v_cache, slots, 1.0 / k_scale, 1.0 / v_scale,
        cos_sin_cache.stride(0), *q3.stride(), *k3.stride(), *v3.stride(),
        k_cache.stride(1) if cache else 0, v_cache.stride(1) if cache else 0,
        NUM_Q_HEADS=num_q_heads, Q_HEADS_PAD=triton.next_power_of_2(num_q_heads),
        NUM_K_HEADS=num_k_heads, K_HEADS_PAD=triton.next_power_of_2(num_k_heads),
        HALF=half, HALF_PAD=triton.next_power_of_2(half), NORM=norm_weights is not None,
        WRITE_CACHE=cache is not None, FP8=k_cache.dtype in FP8_DTYPES,
        num_warps=min(8, triton.next_power_of_2(max(1, heads_pad * head_size // 1024))),
        # a multiply-subtract contracted into one fma would round once where torch rounds twice
        enable_fp_fusion=False, **pdl_options(q),
    )
    return q_out, k_out


def rotary_embedding_ref(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure-torch reference of rotary_embedding."""
    head_size = cos_sin_cache.shape[-1]
    cos, sin = cos_sin_cache[positions].to(q.dtype).unsqueeze(1).chunk(2, dim=-1)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.view(x.shape[0], -1, head_size).chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).view(x.shape)

    return rotate(q), rotate(k)
