"""Paged attention with FlashInfer: a prefill wrapper for batches with any query longer than one token, a
tensor-core decode wrapper for pure-decode batches, and one decode wrapper per captured CUDA graph batch size.

FlashInfer splits the work in two: plan() reads the batch's page layout on the host once per step, then
run() attends for each layer. prepare() plans; the first forward() of a step that was not prepared plans
too, which is also how the backend learns the model's head counts, head size, page size and dtype.

A plan fixes the sliding window and the logits soft-cap, so each (window, soft-cap) pair the model's
layers use (Gemma's local and global layers) has its own wrappers and plan: a "variant".
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import flashinfer
import numpy as np
import torch

from wick.kernels.kv_cache_write import kv_cache_write
from wick.layers.attention.backend import AttentionBackend
from wick.layers.attention.metadata import AttentionMetadata

if TYPE_CHECKING:
    from wick.layers.rotary import RopeInputs

WORKSPACE_BYTES = 128 * 1024 * 1024


@dataclass(frozen=True)
class _Shape:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    q_dtype: torch.dtype
    kv_dtype: torch.dtype
    scale: float


@dataclass
class _PageLayout:
    """FlashInfer's description of a batch's KV pages, on the host."""

    indptr: torch.Tensor  # [num_reqs + 1] int32: request i owns indices[indptr[i]:indptr[i+1]]
    indices: torch.Tensor  # [total pages] int32: block ids
    last_page_len: torch.Tensor  # [num_reqs] int32, in 1..page_size

    @classmethod
    def of(cls, metadata: AttentionMetadata, page_size: int) -> _PageLayout:
        seq_lens = metadata.seq_lens_cpu
        pages = [-(-n // page_size) for n in seq_lens]
        tables = metadata.block_tables_cpu
        if tables is None:
            tables = metadata.block_tables.tolist()
        indices = np.concatenate([np.asarray(row[:n], dtype=np.int32) for row, n in zip(tables, pages, strict=True)])
        return cls(
            indptr=_int32(list(itertools.accumulate(pages, initial=0))),
            indices=torch.from_numpy(indices),
            last_page_len=_int32([n - (p - 1) * page_size for n, p in zip(seq_lens, pages, strict=True)]),
        )


def _int32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device="cpu")


class FlashInferAttentionBackend(AttentionBackend):
    # Graph steps plan their batch size's decode wrapper in prepare(); the captured run() reads the plan
    # from that wrapper's fixed device buffers.
    supports_cuda_graph = True
    caller_writes_kv = True

    def __init__(self) -> None:
        self._workspace: torch.Tensor | None = None
        self._variants: dict[tuple[int | None, float | None], _Variant] = {}

    def prepare(self, metadata: AttentionMetadata) -> None:
        for variant in self._variants.values():
            variant.prepare(metadata)

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
        if rope is not None:
            raise ValueError("the flashinfer backend takes q and k rotated (its rotates_at_decode is False)")
        key = (sliding_window, logits_soft_cap)
        variant = self._variants.get(key)
        if variant is None:
            if self._workspace is None:
                self._workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=q.device)
            variant = self._variants[key] = _Variant(self._workspace, sliding_window, logits_soft_cap)
        return variant.forward(q, k, v, k_cache, v_cache, metadata, scale, k_scale, v_scale, kv_written)


class _Variant:
    """The wrappers and the current plan of one (sliding window, soft-cap) pair."""

    def __init__(self, workspace: torch.Tensor, sliding_window: int | None, logits_soft_cap: float | None) -> None:
        self._shape: _Shape | None = None
        self._workspace = workspace
        # FlashInfer's window_left counts the keys before the query's own
        self._window_left = sliding_window - 1 if sliding_window else -1
        self._soft_cap = logits_soft_cap
        self._prefill: flashinfer.BatchPrefillWithPagedKVCacheWrapper | None = None
        self._decode: flashinfer.BatchDecodeWithPagedKVCacheWrapper | None = None
        self._graph_decode: dict[int, flashinfer.BatchDecodeWithPagedKVCacheWrapper] = {}
        self._planned_for: AttentionMetadata | None = None
        self._plan_copied: torch.cuda.Event | None = None
        self._wrapper: (flashinfer.BatchPrefillWithPagedKVCacheWrapper
                        | flashinfer.BatchDecodeWithPagedKVCacheWrapper | None) = None

    def prepare(self, metadata: AttentionMetadata) -> None:
        if self._shape is not None:
            self._plan(metadata, self._shape)

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
        kv_written: bool = False,
    ) -> torch.Tensor:
        if not kv_written:
            kv_cache_write(k, v, k_cache, v_cache, metadata.slot_mapping, k_scale, v_scale)
        if metadata is not self._planned_for:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError("FlashInfer plans on the host: call prepare() or run the step once before capture")
            _, page_size, num_kv_heads, head_dim = k_cache.shape
            shape = _Shape(q.shape[1], num_kv_heads, head_dim, page_size, q.dtype, k_cache.dtype, scale)
            self._plan(metadata, shape)
        elif self._shape is not None and scale != self._shape.scale:
            raise ValueError("the flashinfer backend plans one softmax scale for all layers")
        assert self._wrapper is not None
        num_request_tokens = metadata.query_start_loc_cpu[-1]
        out = q.new_empty(q.shape) if num_request_tokens == q.shape[0] else q.new_zeros(q.shape)
        scales = {} if (k_scale, v_scale) == (1.0, 1.0) else {"k_scale": k_scale, "v_scale": v_scale}
        self._wrapper.run(q[:num_request_tokens], (k_cache, v_cache), out=out[:num_request_tokens], **scales)
        return out

    def _plan(self, metadata: AttentionMetadata, shape: _Shape) -> None:
        if shape.q_dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"the flashinfer backend needs float16 or bfloat16, not {shape.q_dtype}; "
                             "choose the triton or torch attention backend")
        # A plan copies its tables from pinned host buffers without waiting; with overlapped scheduling the
        # next plan comes while the step runs, so it waits until the previous copy has left those buffers.
        if self._plan_copied is not None:
            self._plan_copied.synchronize()
        layout = _PageLayout.of(metadata, shape.page_size)
        heads = (shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.page_size)
        options = dict(q_data_type=shape.q_dtype, kv_data_type=shape.kv_dtype, sm_scale=shape.scale,
                       window_left=self._window_left, logits_soft_cap=self._soft_cap)
        if metadata.max_query_len > 1:
            if self._prefill is None:
                self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD")
            self._prefill.plan(_int32(metadata.query_start_loc_cpu), layout.indptr, layout.indices,
                               layout.last_page_len, *heads, causal=True, **options)
            self._wrapper = self._prefill
        else:
            decode = self._graph_wrapper(metadata) if metadata.cuda_graph else self._eager_decode()
            decode.plan(layout.indptr, layout.indices, layout.last_page_len, *heads, **options)
            self._wrapper = decode
        self._shape = shape
        self._planned_for = metadata
        self._plan_copied = torch.cuda.Event()
        self._plan_copied.record()

    def _eager_decode(self) -> flashinfer.BatchDecodeWithPagedKVCacheWrapper:
        if self._decode is None:
            self._decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self._workspace, "NHD",
                                                                         use_tensor_cores=True)
        return self._decode

    def _graph_wrapper(self, metadata: AttentionMetadata) -> flashinfer.BatchDecodeWithPagedKVCacheWrapper:
        """The decode wrapper of this batch size, made on its first (capture-time) plan: the block table's
        width then is the most pages a request can have."""
        batch_size = metadata.num_reqs
        wrapper = self._graph_decode.get(batch_size)
        if wrapper is None:
            device = metadata.seq_lens.device
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self._workspace, "NHD", use_cuda_graph=True, use_tensor_cores=True,
                paged_kv_indptr_buffer=torch.zeros(batch_size + 1, dtype=torch.int32, device=device),
                paged_kv_indices_buffer=torch.zeros(batch_size * metadata.block_tables.shape[1], dtype=torch.int32,
                                                    device=device),
                paged_kv_last_page_len_buffer=torch.ones(batch_size, dtype=torch.int32, device=device),
            )
            self._graph_decode[batch_size] = wrapper
        return wrapper
