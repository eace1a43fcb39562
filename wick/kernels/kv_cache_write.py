"""Writing a batch's new K/V into the paged KV cache, token t to flat slot slot_mapping[t]."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _kv_cache_write_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kc_slot, stride_kc_head, stride_vc_slot, stride_vc_head,
    NUM_KV_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
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
    tl.store(k_cache_ptr + slot * stride_kc_slot + heads[:, None] * stride_kc_head + dims[None, :], k, mask=mask)
    tl.store(v_cache_ptr + slot * stride_vc_slot + heads[:, None] * stride_vc_head + dims[None, :], v, mask=mask)


def kv_cache_write(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """k, v [T, Hkv, D] into k_cache, v_cache [num_blocks, block_size, Hkv, D]; slots < 0 are skipped.

    D must be a power of two, each head's D values contiguous in k and v, and the caches contiguous.
    """
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    if k.stride(-1) != 1 or v.stride(-1) != 1 or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("kv_cache_write needs contiguous heads in k, v and contiguous caches")
    _kv_cache_write_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(1), k_cache.stride(2), v_cache.stride(1), v_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads, HEADS_PAD=triton.next_power_of_2(num_kv_heads), HEAD_DIM=head_dim,
    )


def kv_cache_write_ref(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Pure-torch reference of kv_cache_write."""
    write = slot_mapping >= 0
    slots = slot_mapping[write]
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k[write])
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v[write])
