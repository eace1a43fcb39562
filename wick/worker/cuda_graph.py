"""CUDA graphs for pure-decode steps: one graph per captured batch size, inputs in the step buffers,
a batch padded up to the next captured size."""

from __future__ import annotations

import bisect
import logging

import numpy as np
import torch
from torch import nn

from wick.layers.attention.backend import AttentionBackend
from wick.layers.attention.metadata import AttentionMetadata, set_forward_context
from wick.worker.step_buffers import PackedStep, StepBuffers

logger = logging.getLogger(__name__)


def capture_sizes(max_num_seqs: int) -> list[int]:
    sizes = [s for s in (1, 2, 4, 8) if s <= max_num_seqs]
    sizes += list(range(16, max_num_seqs + 1, 16))
    if sizes[-1] != max_num_seqs and max_num_seqs > 8:
        sizes.append(-(-max_num_seqs // 16) * 16)
    return sizes


class DecodeGraphs:
    """Each graph takes the previous step's tokens and the block table into its inputs (kernels.decode_inputs: a
    graph reads its own table, as wide as the longest context), runs the forward, the LM head and the draw from
    the rows' temperatures, seeds and steps into the step buffers' samples (kernels.sampling.exponential_race), on
    the step buffers' decode sections of its batch size. A step whose rows need more of the sampler (filters,
    penalties, logprobs, grammar) samples the graph's logits eagerly instead."""

    def __init__(self, model: nn.Module, backend: AttentionBackend, buffers: StepBuffers, max_num_seqs: int,
                 max_model_len: int, block_size: int, device: torch.device) -> None:
        self.model = model
        self.backend = backend
        self.buffers = buffers
        self.sizes = capture_sizes(max_num_seqs)
        self.max_model_len = max_model_len
        max_blocks = -(-max_model_len // block_size)
        self.block_tables = torch.zeros((self.sizes[-1], max_blocks), dtype=torch.int32, device=device)
        # One logits buffer that every graph writes its rows into (graphs keep their outputs alive, and logits
        # per batch size would hold sum(sizes) rows of the vocabulary); made by the first warm-up, the largest.
        self.logits: torch.Tensor | None = None
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.hidden: dict[int, torch.Tensor] = {}

    @property
    def max_batch_size(self) -> int:
        return self.sizes[-1]

    def batch_size(self, num_reqs: int) -> int:
        """The captured batch size a decode step of num_reqs requests is padded to."""
        return self.sizes[bisect.bisect_left(self.sizes, num_reqs)]

    def _metadata(self, bs: int, seq_lens_cpu: list[int], block_tables_cpu: np.ndarray | None) -> AttentionMetadata:
        # Kernels size their grids from the batch size and max_seq_len; the graph is captured with the
        # longest possible context so one graph serves every step.
        views = self.buffers.decode_views(bs)
        return AttentionMetadata(
            slot_mapping=views.slot_mapping, query_start_loc=views.query_start_loc, seq_lens=views.seq_lens,
            block_tables=self.block_tables[:bs], max_query_len=1, max_seq_len=self.max_model_len,
            query_start_loc_cpu=list(range(bs + 1)), seq_lens_cpu=seq_lens_cpu, block_tables_cpu=block_tables_cpu,
            cuda_graph=True)

    def _forward(self, bs: int) -> torch.Tensor:
        # Imported on first use: Triton fixes at import whether it compiles or interprets its kernels.
        from wick.kernels.decode_inputs import decode_inputs
        from wick.kernels.sampling import exponential_race

        views, samples = self.buffers.decode_views(bs), self.buffers.samples
        decode_inputs(views.input_ids, views.previous_rows, samples, views.table_shape, views.packed_table,
                      self.block_tables)
        hidden = self.model(views.input_ids, views.positions)
        logits = self.model.compute_logits(hidden)
        if self.logits is None:
            self.logits = torch.empty((self.sizes[-1], logits.shape[-1]), dtype=logits.dtype, device=logits.device)
        self.logits[:bs].copy_(logits)
        exponential_race(logits, views.temperature, views.seeds, views.steps, out=samples[:bs])
        return hidden

    @torch.inference_mode()
    def capture(self) -> None:
        pool = None
        for bs in reversed(self.sizes):
            self.buffers.fill_decode(bs)
            metadata = self._metadata(bs, [self.max_model_len] * bs,
                                      np.zeros((bs, self.block_tables.shape[1]), dtype=np.int32))
            self.backend.prepare(metadata)
            with set_forward_context(metadata, self.backend):
                self._forward(bs)  # warm-up: compile kernels outside capture
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.hidden[bs] = self._forward(bs)
            pool = graph.pool()
            self.graphs[bs] = graph
        torch.cuda.synchronize()
        logger.info("captured CUDA graphs for decode batch sizes %s", self.sizes)

    def run(self, step: PackedStep) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Replays the graph of the step's padded batch size; returns the hidden states, the logits (in the LM
        head's dtype) and the tokens drawn from them (for rows that sample plainly) of its real rows."""
        metadata, n = step.metadata, step.num_reqs
        bs = len(metadata.seq_lens_cpu)
        # Backends that plan on the host do it now; padding rows have one token of context.
        host_tables = metadata.block_tables_cpu
        if host_tables is not None and bs > n:
            host_tables = np.concatenate([host_tables, np.zeros((bs - n, host_tables.shape[1]), np.int32)])
        self.backend.prepare(self._metadata(bs, metadata.seq_lens_cpu, host_tables))
        self.graphs[bs].replay()
        return self.hidden[bs][:n], self.logits[:n], self.buffers.samples[:n]
