"""Reference paged attention: gather each request's pages and run SDPA. Any dtype, any device; an fp8
cache is converted back to the queries' dtype and scaled."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from wick.kernels.kv_cache_write import as_storable, write_pages
from wick.layers.attention.backend import AttentionBackend
from wick.layers.attention.metadata import AttentionMetadata


class TorchAttentionBackend(AttentionBackend):
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
    ) -> torch.Tensor:
        _, block_size, num_kv_heads, head_dim = k_cache.shape
        write = metadata.slot_mapping >= 0
        slots = metadata.slot_mapping[write]
        write_pages(k_cache, slots, k[write], k_scale)
        write_pages(v_cache, slots, v[write], v_scale)
        scaled = k_cache.dtype != q.dtype

        group = q.shape[1] // num_kv_heads
        out = torch.zeros_like(q)
        starts = metadata.query_start_loc_cpu
        for i, seq_len in enumerate(metadata.seq_lens_cpu):
            start, end = starts[i], starts[i + 1]
            query_len = end - start
            blocks = metadata.block_tables[i, : -(-seq_len // block_size)]
            keys = as_storable(k_cache)[blocks].flatten(0, 1)[:seq_len].view(k_cache.dtype)
            values = as_storable(v_cache)[blocks].flatten(0, 1)[:seq_len].view(v_cache.dtype)
            if scaled:
                keys, values = keys.to(q.dtype) * k_scale, values.to(q.dtype) * v_scale
            keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
            # query j sits at position seq_len - query_len + j and sees keys up to there
            query_pos = torch.arange(seq_len - query_len, seq_len, device=q.device)
            mask = torch.arange(seq_len, device=q.device) <= query_pos[:, None]
            out[start:end] = F.scaled_dot_product_attention(
                q[start:end].transpose(0, 1),
                keys.transpose(0, 1),
                values.transpose(0, 1),
                attn_mask=mask,
                scale=scale,
            ).transpose(0, 1)
        return out
