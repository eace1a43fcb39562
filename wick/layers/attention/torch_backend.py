"""Reference paged attention: gather each request's pages and run SDPA. Any dtype, any device.

A prompt with nothing cached attends over its own new keys with SDPA's causal kernel (no mask, no gather: on a
CPU this is what keeps a long prefill linear in memory); a decode step needs no mask; a chunk after cached
context gets an explicit mask. Grouped-query heads are SDPA's `enable_gqa`, never repeated copies."""

from __future__ import annotations

import torch
import torch.nn.functional as F

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
    ) -> torch.Tensor:
        _, block_size, num_kv_heads, head_dim = k_cache.shape
        write = metadata.slot_mapping >= 0
        slots = metadata.slot_mapping[write]
        k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, k[write])
        v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, v[write])

        out = torch.zeros_like(q)
        starts = metadata.query_start_loc_cpu
        for i, seq_len in enumerate(metadata.seq_lens_cpu):
            start, end = starts[i], starts[i + 1]
            query_len = end - start
            if query_len == seq_len:
                # A prompt with nothing cached: its own keys, causal (SDPA's fused kernel; no mask, no gather).
                keys, values, mask, causal = k[start:end], v[start:end], None, True
            else:
                blocks = metadata.block_tables[i, : -(-seq_len // block_size)]
                keys = k_cache[blocks].flatten(0, 1)[:seq_len]
                values = v_cache[blocks].flatten(0, 1)[:seq_len]
                causal = False
                mask = None
                if query_len > 1:
                    # query j sits at position seq_len - query_len + j and sees keys up to there
                    query_pos = torch.arange(seq_len - query_len, seq_len, device=q.device)
                    mask = torch.arange(seq_len, device=q.device) <= query_pos[:, None]
            out[start:end] = F.scaled_dot_product_attention(
                q[start:end].transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1),
                attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True,
            ).transpose(0, 1)
        return out
