"""Paged attention with our Triton kernels: one kernel writes K/V into the pages (unless the layer has, in its
rotary kernel), one attends. At a decode step the attention kernel also rotates q and k and writes K/V itself, and
where it split the keys and the caller asks (`pending`), the output is left pending (PendingCombine)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from wick.kernels.kv_cache_write import kv_cache_write
from wick.kernels.paged_attention import LARGE_DECODE, paged_attention
from wick.kernels.split_combine import SplitPartials, combine_splits
from wick.layers.attention.backend import AttentionBackend
from wick.layers.attention.metadata import AttentionMetadata
from wick.layers.pending_combine import PendingCombine

if TYPE_CHECKING:
    from wick.layers.rotary import RopeInputs


class TritonAttentionBackend(AttentionBackend):
    # the kernels' grids depend only on the token count, the request count, max_query_len and max_seq_len
    supports_cuda_graph = True
    supports_prefill_graph = True
    caller_writes_kv = True
    rotates_at_decode = True
    decode_order_from = LARGE_DECODE
    defers_combine = True

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
        pending: bool = False,
    ) -> torch.Tensor | PendingCombine:
        if kv_written and rope is not None:
            raise ValueError("with rope the attention kernel writes k and v: they cannot be in the cache already")
        if not kv_written and rope is None:
            kv_cache_write(k, v, k_cache, v_cache, metadata.slot_mapping, k_scale, v_scale)
        # A prefill graph's rows past its request vary from replay to replay: the kernel leaves them as they are.
        prefill_graph = metadata.cuda_graph and metadata.max_query_len > 1
        out = paged_attention(q, k_cache, v_cache, metadata.query_start_loc, metadata.seq_lens,
                              metadata.block_tables, scale, metadata.max_query_len, metadata.max_seq_len,
                              out=torch.zeros_like(q) if prefill_graph else None,
                              sliding_window=sliding_window, logits_soft_cap=logits_soft_cap,
                              k_scale=k_scale, v_scale=v_scale, rope=rope,
                              new_kv=None if rope is None else (k, v, metadata.slot_mapping),
                              order=metadata.decode_order, defer_combine=pending)
        if isinstance(out, SplitPartials):  # its reader may have the combine round it, a decode step's of 32-wide runs
            if out.decode and q.shape[-1] % 32 == 0:
                return PendingCombine(out)
            out = combine_splits(out)
        num_request_tokens = metadata.query_start_loc_cpu[-1]
        if num_request_tokens < q.shape[0]:
            out[num_request_tokens:].zero_()  # tokens of no request, left unwritten by the kernel
        return out
