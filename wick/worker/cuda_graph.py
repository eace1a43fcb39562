"""CUDA graphs for pure-decode steps, one per captured batch size, and for steps of one request's prefill, one per
captured token count; inputs in the step buffers, a step padded up to the next captured shape."""

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

# Token counts captured for a lone request's prefill step, up to the step buffers' tokens. Past them the step runs
# eagerly, where its host time matters less next to its GPU time.
PREFILL_SIZES = (16, 32, 64, 96, 128, 192, 256, 384, 512)


def capture_sizes(max_num_seqs: int) -> list[int]:
    sizes = [s for s in (1, 2, 4, 8) if s <= max_num_seqs]
    sizes += list(range(16, max_num_seqs + 1, 16))
    if sizes[-1] != max_num_seqs and max_num_seqs > 8:
        sizes.append(-(-max_num_seqs // 16) * 16)
    return sizes


class StepGraphs:
    """Each graph copies the step's block table into its own (kernels.decode_inputs: a graph reads its own table, as
    wide as the longest context; a decode graph also takes the previous step's tokens there and ranks its requests
    longest context first, AttentionMetadata.decode_order), runs the forward, the LM
    head over each request's last row and the draw from the rows' temperatures, seeds and steps into the step buffers'
    samples (kernels.sampling.exponential_race), on the step buffers' sections of its shape. A step whose rows need
    more of the sampler (filters, penalties, logprobs, grammar) samples the graph's logits eagerly instead.

    A decode graph of b requests has b tokens. A prefill graph has one request of up to t tokens, the rest of no
    request (positions 0, written nowhere, their attention zero); only with a backend that supports it
    (AttentionBackend.supports_prefill_graph)."""

    def __init__(self, model: nn.Module, backend: AttentionBackend, buffers: StepBuffers, max_num_seqs: int,
                 max_model_len: int, block_size: int, device: torch.device) -> None:
        self.model = model
        self.backend = backend
        self.buffers = buffers
        self.sizes = capture_sizes(max_num_seqs)
        # up to the first count that holds a whole context: no step of one request has more tokens
        sizes = [t for t in PREFILL_SIZES if t <= buffers.max_tokens] if backend.supports_prefill_graph else []
        self.prefill_sizes = sizes[:bisect.bisect_left(sizes, max_model_len) + 1]
        self.max_model_len = max_model_len
        max_blocks = -(-max_model_len // block_size)
        self.block_tables = torch.zeros((self.sizes[-1], max_blocks), dtype=torch.int32, device=device)
        self.decode_order = torch.zeros(self.sizes[-1], dtype=torch.int32, device=device)
        # One logits buffer that every graph writes its rows into (graphs keep their outputs alive, and logits
        # per batch size would hold sum(sizes) rows of the vocabulary); made by the first warm-up, the largest.
        self.logits: torch.Tensor | None = None
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.hidden: dict[tuple[int, int], torch.Tensor] = {}

    @property
    def max_batch_size(self) -> int:
        return self.sizes[-1]

    def batch_size(self, num_reqs: int) -> int:
        """The captured batch size a decode step of num_reqs requests is padded to."""
        return self.sizes[bisect.bisect_left(self.sizes, num_reqs)]

    def prefill_size(self, num_tokens: int) -> int | None:
        """The captured token count a lone request's prefill step of num_tokens is padded to; None past them."""
        i = bisect.bisect_left(self.prefill_sizes, num_tokens)
        return self.prefill_sizes[i] if i < len(self.prefill_sizes) else None

    def _metadata(self, t: int, b: int, seq_lens_cpu: list[int],
                  block_tables_cpu: np.ndarray | None) -> AttentionMetadata:
        # Kernels size their grids from the token and request counts, max_query_len and max_seq_len; the graph is
        # captured with the longest possible context so one graph serves every step.
        views = self.buffers.views(t, b)
        return AttentionMetadata(
            slot_mapping=views.slot_mapping, query_start_loc=views.query_start_loc, seq_lens=views.seq_lens,
            block_tables=self.block_tables[:b], max_query_len=t - b + 1, max_seq_len=self.max_model_len,
            query_start_loc_cpu=[*range(b), t], seq_lens_cpu=seq_lens_cpu, block_tables_cpu=block_tables_cpu,
            cuda_graph=True, decode_order=self.decode_order[:b] if self._ranks(t, b) else None)

    def _ranks(self, t: int, b: int) -> bool:
        """Whether the graph of t tokens and b requests ranks them for its attention: a decode graph large enough."""
        start = self.backend.decode_order_from
        return t == b and start is not None and b >= start

    def _forward(self, t: int, b: int) -> torch.Tensor:
        # Imported on first use: Triton fixes at import whether it compiles or interprets its kernels.
        from wick.kernels.decode_inputs import decode_inputs
        from wick.kernels.sampling import exponential_race

        views, samples = self.buffers.views(t, b), self.buffers.samples
        decode_inputs(views.input_ids[:b], views.previous_rows, samples, views.table_shape, views.packed_table,
                      self.block_tables, *((views.seq_lens, self.decode_order[:b]) if self._ranks(t, b) else ()))
        hidden = self.model(views.input_ids, views.positions)
        last = hidden if t == b else hidden.index_select(0, views.query_start_loc[1:].long() - 1)
        logits = self.model.compute_logits(last)
        if self.logits is None:
            self.logits = torch.empty((self.sizes[-1], logits.shape[-1]), dtype=logits.dtype, device=logits.device)
        self.logits[:b].copy_(logits)
        exponential_race(logits, views.temperature, views.seeds, views.steps, out=samples[:b])
        return hidden

    @torch.inference_mode()
    def capture(self) -> None:
        pool = None
        shapes = [(bs, bs) for bs in reversed(self.sizes)] + [(t, 1) for t in reversed(self.prefill_sizes)]
        for t, b in shapes:
            self.buffers.fill(t, b, self.max_model_len)
            metadata = self._metadata(t, b, self.buffers.views(t, b).seq_lens.tolist(),
                                      np.zeros((b, self.block_tables.shape[1]), dtype=np.int32))
            self.backend.prepare(metadata)
            with set_forward_context(metadata, self.backend):
                self._forward(t, b)  # warm-up: compile kernels outside capture
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.hidden[t, b] = self._forward(t, b)
            pool = graph.pool()
            self.graphs[t, b] = graph
        torch.cuda.synchronize()
        logger.info("captured CUDA graphs for decode batch sizes %s and one request's prefill of %s tokens",
                    self.sizes, self.prefill_sizes or "no")

    def run(self, step: PackedStep) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Replays the graph of the step's padded shape; returns the hidden states of its tokens, and of its real
        requests the logits of their last tokens (in the LM head's dtype) and the tokens drawn from them (for rows
        that sample plainly)."""
        metadata, n = step.metadata, step.num_reqs
        t, b = step.input_ids.numel(), len(metadata.seq_lens_cpu)
        # Backends that plan on the host do it now; padding rows have one token of context.
        host_tables = metadata.block_tables_cpu
        if host_tables is not None and b > n:
            host_tables = np.concatenate([host_tables, np.zeros((b - n, host_tables.shape[1]), np.int32)])
        self.backend.prepare(self._metadata(t, b, metadata.seq_lens_cpu, host_tables))
        self.graphs[t, b].replay()
        return self.hidden[t, b][:metadata.query_start_loc_cpu[n]], self.logits[:n], self.buffers.samples[:n]
