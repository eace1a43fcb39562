"""What every attention backend needs to know about one packed batch, and the forward context
through which the model runner hands it to the attention layers."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from wick.layers.attention.backend import AttentionBackend


@dataclass
class AttentionMetadata:
    """A packed batch: request i owns query tokens query_start_loc[i]:query_start_loc[i+1].

    Its new tokens sit at the end of its context: context length seq_lens[i], of which the first
    seq_lens[i] - query_len(i) tokens are already in the KV cache.
    """

    slot_mapping: torch.Tensor  # [num_tokens] int64; block_id * block_size + offset; -1: do not write
    query_start_loc: torch.Tensor  # [num_reqs + 1] int32
    seq_lens: torch.Tensor  # [num_reqs] int32
    block_tables: torch.Tensor  # [num_reqs, max_blocks_per_req] int32, padded with 0
    max_query_len: int
    max_seq_len: int
    query_start_loc_cpu: list[int]
    seq_lens_cpu: list[int]
    # Host copy of block_tables' rows (each covering at least its request's pages), when the producer has one.
    block_tables_cpu: np.ndarray | list[list[int]] | None = None
    # A step that StepGraphs captures or replays, padded up to a captured shape.
    cuda_graph: bool = False
    # A decode graph's requests longest context first ([num_reqs] int32, ranked on the device by the graph's first
    # kernel): the order in which a backend may take them.
    decode_order: torch.Tensor | None = None

    @property
    def num_reqs(self) -> int:
        return len(self.seq_lens_cpu)

    # first_of_consecutive_pages' answers for this forward: (request, pages) -> first page or None.
    _page_runs: dict[tuple[int, int], int | None] = field(default_factory=dict, init=False, repr=False, compare=False)

    def first_of_consecutive_pages(self, i: int, pages: int) -> int | None:
        """Request i's first page where its first `pages` pages lie one after another in the cache (so one view
        reads them, no gather), else None. Answered from block_tables_cpu once per forward."""
        key = (i, pages)
        if key not in self._page_runs:
            row = np.asarray(self.block_tables_cpu[i][:pages] if self.block_tables_cpu is not None else [])
            consecutive = len(row) == pages and bool((np.diff(row) == 1).all())
            self._page_runs[key] = int(row[0]) if consecutive else None
        return self._page_runs[key]

    @cached_property
    def written(self) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(the tokens whose K/V go into the cache, None for all of them; their slots): once per forward."""
        write = self.slot_mapping >= 0
        if bool(write.all()):
            return None, self.slot_mapping
        tokens = write.nonzero().squeeze(1)
        return tokens, self.slot_mapping.index_select(0, tokens)


@dataclass
class ForwardContext:
    attn_metadata: AttentionMetadata
    backend: AttentionBackend


_context: ForwardContext | None = None


@contextmanager
def set_forward_context(attn_metadata: AttentionMetadata, backend: AttentionBackend) -> Iterator[None]:
    global _context
    previous, _context = _context, ForwardContext(attn_metadata, backend)
    try:
        yield
    finally:
        _context = previous


def get_forward_context() -> ForwardContext:
    if _context is None:
        raise RuntimeError("attention called outside set_forward_context()")
    return _context
