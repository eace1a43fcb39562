"""CUDA graphs for pure-decode steps: one graph per captured batch size, inputs in static buffers,
a batch padded up to the next captured size."""

from __future__ import annotations

import bisect
import logging

import torch
from torch import nn

from wick.layers.attention.backend import AttentionBackend
from wick.layers.attention.metadata import AttentionMetadata, set_forward_context

logger = logging.getLogger(__name__)


def capture_sizes(max_num_seqs: int) -> list[int]:
    sizes = [s for s in (1, 2, 4, 8) if s <= max_num_seqs]
    sizes += list(range(16, max_num_seqs + 1, 16))
    if sizes[-1] != max_num_seqs and max_num_seqs > 8:
        sizes.append(-(-max_num_seqs // 16) * 16)
    return sizes


class DecodeGraphs:
    def __init__(self, model: nn.Module, backend: AttentionBackend, max_num_seqs: int, max_model_len: int,
                 block_size: int, device: torch.device) -> None:
        self.model = model
        self.backend = backend
        self.sizes = capture_sizes(max_num_seqs)
        self.max_model_len = max_model_len
        max_bs = self.sizes[-1]
        max_blocks = -(-max_model_len // block_size)
        self.input_ids = torch.zeros(max_bs, dtype=torch.long, device=device)
        self.positions = torch.zeros(max_bs, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((max_bs,), -1, dtype=torch.long, device=device)
        self.seq_lens = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(max_bs + 1, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros((max_bs, max_blocks), dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    @property
    def max_batch_size(self) -> int:
        return self.sizes[-1]

    def _metadata(self, bs: int, seq_lens_cpu: list[int],
                  block_tables_cpu: list[list[int]] | None) -> AttentionMetadata:
        # Kernels size their grids from the batch size and max_seq_len; the graph is captured with the
        # longest possible context so one graph serves every step.
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:bs], query_start_loc=self.query_start_loc[:bs + 1],
            seq_lens=self.seq_lens[:bs], block_tables=self.block_tables[:bs], max_query_len=1,
            max_seq_len=self.max_model_len, query_start_loc_cpu=list(range(bs + 1)),
            seq_lens_cpu=seq_lens_cpu, block_tables_cpu=block_tables_cpu, cuda_graph=True)

    @torch.inference_mode()
    def capture(self) -> None:
        pool = None
        for bs in reversed(self.sizes):
            metadata = self._metadata(bs, [self.max_model_len] * bs, [[0] * self.block_tables.shape[1]] * bs)
            self.backend.prepare(metadata)
            with set_forward_context(metadata, self.backend):
                self.model(self.input_ids[:bs], self.positions[:bs])  # warm-up: compile kernels outside capture
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.outputs[bs] = self.model(self.input_ids[:bs], self.positions[:bs])
            pool = graph.pool()
            self.graphs[bs] = graph
        torch.cuda.synchronize()
        logger.info("captured CUDA graphs for decode batch sizes %s", self.sizes)

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        """Input ids and positions are already on the device; returns the hidden states of the n real rows."""
        n = input_ids.numel()
        bs = self.sizes[bisect.bisect_left(self.sizes, n)]
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(metadata.slot_mapping)
        self.slot_mapping[n:bs].fill_(-1)
        self.seq_lens[:n].copy_(metadata.seq_lens)
        self.seq_lens[n:bs].fill_(1)
        self.block_tables[:n, : metadata.block_tables.shape[1]].copy_(metadata.block_tables)
        # Padding rows: one token of context, nothing written. Backends that plan on the host do it now.
        tables = metadata.block_tables_cpu
        self.backend.prepare(self._metadata(bs, metadata.seq_lens_cpu + [1] * (bs - n),
                                            None if tables is None else tables + [[0]] * (bs - n)))
        self.graphs[bs].replay()
        return self.outputs[bs][:n]
