"""Reference paged attention: gather each request's pages and run SDPA. Any dtype, any device.

A prompt with nothing cached attends over its own new keys with SDPA's causal kernel (no mask, no gather: on a
CPU this is what keeps a long prefill linear in memory); a request whose pages lie one after another in the cache
is read through a view of them, others through a gather; a decode step needs no mask; a chunk after cached
context or a sliding window gets an explicit mask. Grouped-query heads are SDPA's `enable_gqa`
(repeated copies only for soft-capping, which SDPA cannot do). Attention over the cache gets 4-D inputs: with 3-D
ones a CPU takes SDPA's unfused math path, 4-5x slower for a decode step. A whole prompt keeps the 3-D math path:
the fused kernel is 3x faster there, but its last bits flip the default model's near-tied first answer token to
the README's question (" The" by 0.08 in logprob on the math path, " La" by 0.01 on the fused one). An fp8 cache
is converted back to the queries' dtype and scaled; a prompt then attends over its new keys as that cache holds
them. The cache is [num_blocks, block_size, Hkv, D] in shape but head-major in memory ([Hkv, num_blocks,
block_size, D] permuted): each head's keys in consecutive pages are one contiguous run, which SDPA streams
1.9x faster than positions Hkv * D apart once the cache no longer fits the CPU's caches (docs/cpu.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from wick.kernels.kv_cache_write import as_storable, to_cache, write_pages
from wick.layers.attention.backend import AttentionBackend
from wick.layers.attention.metadata import AttentionMetadata

if TYPE_CHECKING:
    from wick.layers.rotary import RopeInputs


class TorchAttentionBackend(AttentionBackend):
    def allocate_kv_cache(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        num_blocks, block_size, num_kv_heads, head_dim = shape
        head_major = torch.zeros(num_kv_heads, num_blocks, block_size, head_dim, dtype=dtype, device=device)
        return head_major.permute(1, 2, 0, 3)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
        kv_written: bool = False,
        rope: RopeInputs | None = None,
    ) -> torch.Tensor:
        if kv_written:
            raise ValueError("the torch backend writes the cache itself (its caller_writes_kv is False)")
        if rope is not None:
            raise ValueError("the torch backend takes q and k rotated (its rotates_at_decode is False)")
        _, block_size, num_kv_heads, head_dim = k_cache.shape
        tokens, slots = metadata.written
        written_k, written_v = (k, v) if tokens is None else (k.index_select(0, tokens), v.index_select(0, tokens))
        write_pages(k_cache, slots, written_k, k_scale)
        write_pages(v_cache, slots, written_v, v_scale)
        scaled = k_cache.dtype != q.dtype
        if scaled:
            k = to_cache(k, k_cache.dtype, k_scale).to(q.dtype) * k_scale
            v = to_cache(v, v_cache.dtype, v_scale).to(q.dtype) * v_scale

        out = torch.zeros_like(q)
        starts = metadata.query_start_loc_cpu
        for i, seq_len in enumerate(metadata.seq_lens_cpu):
            start, end = starts[i], starts[i + 1]
            query_len = end - start
            if query_len == seq_len and sliding_window is None and logits_soft_cap is None:
                # A prompt with nothing cached: its own keys, causal (SDPA's fused kernel; no mask, no gather).
                out[start:end] = F.scaled_dot_product_attention(
                    q[start:end].transpose(0, 1), k[start:end].transpose(0, 1), v[start:end].transpose(0, 1),
                    is_causal=True, scale=scale, enable_gqa=True).transpose(0, 1)
                continue
            pages = -(-seq_len // block_size)
            first = metadata.first_of_consecutive_pages(i, pages)
            if first is not None:
                keys = k_cache[first:first + pages].flatten(0, 1)[:seq_len]
                values = v_cache[first:first + pages].flatten(0, 1)[:seq_len]
            else:
                blocks = metadata.block_tables[i, :pages]
                # index_select, not k_cache[blocks]: advanced indexing takes a slow path on a CPU (4x here).
                keys = as_storable(k_cache).index_select(0, blocks).flatten(0, 1)[:seq_len].view(k_cache.dtype)
                values = as_storable(v_cache).index_select(0, blocks).flatten(0, 1)[:seq_len].view(v_cache.dtype)
            if scaled:
                keys, values = keys.to(q.dtype) * k_scale, values.to(q.dtype) * v_scale
            mask = None
            if query_len > 1 or sliding_window is not None:
                # query j sits at position seq_len - query_len + j and sees keys up to there
                query_pos = torch.arange(seq_len - query_len, seq_len, device=q.device)
                key_pos = torch.arange(seq_len, device=q.device)
                mask = key_pos <= query_pos[:, None]
                if sliding_window is not None:
                    mask &= key_pos > query_pos[:, None] - sliding_window
            out[start:end] = _attend(q[start:end].transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1),
                                     mask, scale, logits_soft_cap).transpose(0, 1)
        return out


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
            soft_cap: float | None) -> torch.Tensor:
    if soft_cap is None:
        return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, scale=scale,
                                              enable_gqa=True)[0]
    group = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale
    scores = soft_cap * torch.tanh(scores / soft_cap)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = scores.softmax(dim=-1)
    return torch.matmul(probs.to(v.dtype), v)
