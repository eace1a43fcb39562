"""The interface every attention backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch

from wick.layers.attention.metadata import AttentionMetadata

if TYPE_CHECKING:
    from wick.layers.rotary import RopeInputs


class AttentionBackend(ABC):
    # True when forward() reads no host-side per-request values outside prepare(), so a decode step can be
    # captured in a CUDA graph (the grid may depend only on the batch size and metadata.max_seq_len) and
    # replayed after prepare() with another step's metadata.
    supports_cuda_graph: bool = False
    # True when a lone request's prefill step can be captured likewise (max_query_len the graph's token count,
    # max_seq_len its bound), its tokens padded with tokens of no request whose output rows forward() zeroes.
    supports_prefill_graph: bool = False
    # True when the cache is laid out as wick.kernels.kv_cache_write writes it, so a caller may write k/v
    # there itself (the rotary kernel does, while it rotates k) and call forward() with kv_written=True.
    caller_writes_kv: bool = False
    # True when forward() takes `rope` at decode steps (max_query_len 1): q and k not yet rotated, nor k and v written,
    # which its kernel then does itself (no rotary kernel runs).
    rotates_at_decode: bool = False
    # Decode graphs of at least this many rows rank their requests longest context first for forward()
    # (AttentionMetadata.decode_order); None: it takes no order.
    decode_order_from: int | None = None
    # True when forward() takes `pending`: a one-row decode step whose keys it split may then return its output as a
    # layers.pending_combine.PendingCombine, the splits merged by whichever layer reads it.
    defers_combine: bool = False

    def allocate_kv_cache(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A zeroed cache of `shape` ([num_blocks, block_size, Hkv, D]), laid out in memory as this backend
        reads it best."""
        return torch.zeros(shape, dtype=dtype, device=device)

    def prepare(self, metadata: AttentionMetadata) -> None:  # noqa: B027 - a hook, deliberately a no-op here
        """Called once per step, outside any CUDA graph capture, with the metadata object the step's
        forward() calls then receive (a replayed graph calls none): the place for host-side planning."""

    @abstractmethod
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
        """Paged attention over one packed batch.

        q [T, H, D], k and v [T, Hkv, D]: the batch's new tokens. k_cache, v_cache
        [num_blocks, block_size, Hkv, D]. First writes k/v to the cache at metadata.slot_mapping
        (slots < 0 are skipped), then each request's new queries attend causally to its whole
        context read through its block table. Returns [T, H, D].

        sliding_window: a query at position p sees keys at positions > p - sliding_window only.
        logits_soft_cap: scores become cap * tanh(scores / cap) before the softmax (Gemma 2).
        k_scale, v_scale: an fp8 (e4m3) cache holds K / k_scale and V / v_scale.
        kv_written: k and v are in the cache already (backends with caller_writes_kv only).
        rope: q and k are still to be rotated (and each head RMS-normalized first where rope has norm weights),
        as the rotary kernel would; at decode steps of backends with rotates_at_decode only.
        """
