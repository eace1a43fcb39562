"""Writing a batch's new K/V into the paged KV cache, token t to flat slot slot_mapping[t]."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

FP8_DTYPES = (torch.float8_e4m3fn,)
FP8_MAX: tl.constexpr = tl.constexpr(torch.finfo(torch.float8_e4m3fn).max)


@triton.jit
def to_cache_values(x, cache_ptr, inv_scale, FP8: tl.constexpr):
    """x as the cache at cache_ptr holds it: an fp8 cache x * inv_scale, saturated."""
    if FP8:
        return tl.clamp(x.to(tl.float32) * inv_scale, -FP8_MAX, FP8_MAX).to(cache_ptr.dtype.element_ty)
    return x.to(cache_ptr.dtype.element_ty)


@triton.jit
def _kv_cache_write_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr, k_inv_scale, v_inv_scale,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kc_slot, stride_kc_head, stride_vc_slot, stride_vc_head,
    NUM_KV_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, FP8: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    heads = tl.arange(0, HEADS_PAD)
    dims = tl.arange(0, HEAD_DIM)
    mask = heads[:, None] < NUM_KV_HEADS
    k = tl.load(k_ptr + token * stride_kt + heads[:, None] * stride_kh + dims[None, :], mask=mask)
    v = tl.load(v_ptr + token * stride_vt + heads[:, None] * stride_vh + dims[None, :], mask=mask)
    tl.store(k_cache_ptr + slot * stride_kc_slot + heads[:, None] * stride_kc_head + dims[None, :],
             to_cache_values(k, k_cache_ptr, k_inv_scale, FP8), mask=mask)
    tl.store(v_cache_ptr + slot * stride_vc_slot + heads[:, None] * stride_vc_head + dims[None, :],
             to_cache_values(v, v_cache_ptr, v_inv_scale, FP8), mask=mask)


def kv_cache_write(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
    k_scale: float = 1.0, v_scale: float = 1.0,
) -> None:
    """k, v [T, Hkv, D] into k_cache, v_cache [num_blocks, block_size, Hkv, D]; slots < 0 are skipped.

    D must be a power of two, each head's D values contiguous in k and v, and the caches contiguous.
    An fp8 (e4m3) cache stores K / k_scale and V / v_scale, saturated at the format's largest value.
    """
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    if k.stride(-1) != 1 or v.stride(-1) != 1 or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("kv_cache_write needs contiguous heads in k, v and contiguous caches")
    _kv_cache_write_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping, 1.0 / k_scale, 1.0 / v_scale,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(1), k_cache.stride(2), v_cache.stride(1), v_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads, HEADS_PAD=triton.next_power_of_2(num_kv_heads), HEAD_DIM=head_dim,
        FP8=k_cache.dtype in FP8_DTYPES,
    )


@dataclass(frozen=True)
class KVCacheTarget:
    """Where one layer's new K/V go this step: its caches, the step's slots, the fp8 scales. The attention
    backend writes there itself unless the caller has (the rotary kernel, while it rotates k)."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    slot_mapping: torch.Tensor
    k_scale: float = 1.0
    v_scale: float = 1.0

    def write(self, k: torch.Tensor, v: torch.Tensor) -> None:
        kv_cache_write(k, v, self.k_cache, self.v_cache, self.slot_mapping, self.k_scale, self.v_scale)


def to_cache(x: torch.Tensor, cache_dtype: torch.dtype, scale: float) -> torch.Tensor:
    """Values as a cache of `cache_dtype` holds them: fp8 caches hold x / scale, saturated."""
    if cache_dtype not in FP8_DTYPES:
        return x.to(cache_dtype)
    limit = torch.finfo(cache_dtype).max
    return (x.float() / scale).clamp(-limit, limit).to(cache_dtype)


def as_storable(t: torch.Tensor) -> torch.Tensor:
    """fp8 tensors as uint8 views (CPU torch cannot index-copy or gather fp8); others as they are."""
    return t.view(torch.uint8) if t.dtype in FP8_DTYPES else t


def write_pages(cache: torch.Tensor, slots: torch.Tensor, values: torch.Tensor, scale: float) -> None:
    """values [n, Hkv, D] into the flat slots of cache [num_blocks, block_size, Hkv, D], as the cache holds them."""
    flat = as_storable(cache).view(-1, *cache.shape[2:])
    flat.index_copy_(0, slots, as_storable(to_cache(values, cache.dtype, scale)))


def kv_cache_write_ref(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
    k_scale: float = 1.0, v_scale: float = 1.0,
) -> None:
    """Pure-torch reference of kv_cache_write."""
    write = slot_mapping >= 0
    slots = slot_mapping[write]
    write_pages(k_cache, slots, k[write], k_scale)
    write_pages(v_cache, slots, v[write], v_scale)
