"""One step's inputs on the device, packed on the host with numpy into a pinned staging buffer and taken across
by one copy instead of a tensor built from Python lists for each input."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from wick.layers.attention.metadata import AttentionMetadata
from wick.worker.input_batch import InputBatch, ScheduledState


@dataclass
class PackedStep:
    input_ids: torch.Tensor  # [t] int64, the pending ones still to take from the previous step's samples
    positions: torch.Tensor  # [t] int64
    metadata: AttentionMetadata
    # Where input_ids takes a token sampled by the previous step and which row of `samples`: None when none does
    # (or a decode graph takes them).
    gather: tuple[torch.Tensor, torch.Tensor] | None
    # The rows of the hidden states whose logits sample, in order; None when they are rows 0 .. n - 1.
    logit_rows: torch.Tensor | None
    num_reqs: int  # the step's requests; a decode graph's batch may be padded past them


class GraphInputs(NamedTuple):
    """What a graph of t tokens and b requests reads from the step buffers."""

    input_ids: torch.Tensor  # [t] int64
    positions: torch.Tensor  # [t] int64
    slot_mapping: torch.Tensor  # [t] int64
    query_start_loc: torch.Tensor  # [b + 1] int32
    seq_lens: torch.Tensor  # [b] int32
    temperature: torch.Tensor  # [b] float32
    seeds: torch.Tensor  # [b] int64
    steps: torch.Tensor  # [b] int64
    previous_rows: torch.Tensor  # [b] int64: the row of `samples` that gives a decode row its token, -1 where none does
    table_shape: torch.Tensor  # [2] int32: the packed block table's rows and width
    packed_table: torch.Tensor  # int32, flat, from the packed block table's first entry to the buffers' end


class StepBuffers:
    """One buffer, taken to the device by one copy, with sections at offsets that depend only on a step's token
    count t and request count b (padding rows included), each starting at a 16-byte bound (`_Layout`). As int64:
    input ids, positions and slots (t each), the requests' seeds, sampling steps (output tokens before this one) and
    previous rows (b each; see GraphInputs). Then as int32: query_start_loc (b + 1), seq_lens (b), the temperatures'
    float32 bits (b), the block table's rows and width (2) and the table. Then, as int64 again, the gather targets,
    their sources and the rows that sample. A graph of t tokens and b requests (a decode graph: t = b; a prefill
    graph: one request) is captured on those sections, so packing a step of that shape is all its replay needs: the
    graph copies the block table into its own and a decode graph takes the previous step's tokens from `samples`
    (kernels.decode_inputs); other steps gather them themselves (PackedStep.gather).

    The bounds keep each section's address as aligned as a fresh tensor's whatever t and b are: Triton compiles a
    kernel anew for each pattern of 16-byte-aligned pointers it is given, and sections packed end to end made steps
    of new shapes meet new patterns, each a compile of about a second while serving.

    `samples` holds the newest step's sampled tokens, a row per request that sampled, for the next step.

    On a GPU the host arrays are pinned and come in two sets used in turn, so that packing a step never
    overwrites a set whose copy the device has not made yet (one step is in flight while the next packs)."""

    def __init__(self, max_tokens: int, max_reqs: int, max_blocks: int, block_size: int,
                 device: torch.device) -> None:
        self.block_size = block_size
        self.max_tokens, self.max_reqs = max_tokens, max_reqs
        layout = _Layout.of(max_tokens, max_reqs)
        num_longs = layout.table_end(max_reqs * max_blocks) + 3 * max_reqs
        on_gpu = device.type == "cuda"
        sets = 2 if on_gpu else 1
        self._host = [torch.zeros(8 * num_longs, dtype=torch.uint8, pin_memory=on_gpu) for _ in range(sets)]
        self._copied: list[torch.cuda.Event | None] = [None] * sets
        self._set = 0
        self.data = torch.zeros(8 * num_longs, dtype=torch.uint8, device=device) if on_gpu else self._host[0]
        self.longs, self.ints = self.data.view(torch.int64), self.data.view(torch.int32)
        self.samples = torch.zeros(max_reqs, dtype=torch.int64, device=device)

    def views(self, tokens: int, reqs: int) -> GraphInputs:
        longs, t, b, at = self.longs, tokens, reqs, _Layout.of(tokens, reqs)
        ints = self.ints[at.ints:]
        return GraphInputs(longs[:t], longs[at.positions:at.positions + t], longs[at.slots:at.slots + t],
                           ints[:b + 1], ints[at.seq_lens:at.seq_lens + b],
                           ints[at.temperature:at.temperature + b].view(torch.float32), longs[at.seeds:at.seeds + b],
                           longs[at.steps:at.steps + b], longs[at.previous:at.previous + b],
                           ints[at.table_shape:at.table_shape + 2], ints[at.table:])

    def fill(self, tokens: int, reqs: int, max_context: int) -> None:
        """Inputs a graph of t tokens and b requests can be captured on: requests of one token but the last, which
        takes the rest up to max_context tokens (tokens past it belong to no request), their queries their whole
        context; nothing written or gathered, no block table copied, greedy."""
        views = self.views(tokens, reqs)
        for zeroed in (views.input_ids, views.positions, views.temperature, views.seeds, views.steps,
                       views.table_shape):
            zeroed.zero_()
        views.slot_mapping.fill_(-1)
        views.previous_rows.fill_(-1)
        starts = torch.arange(reqs + 1, dtype=torch.int32)
        starts[-1] = reqs - 1 + min(tokens - reqs + 1, max_context)
        views.query_start_loc.copy_(starts)
        views.seq_lens.copy_(starts.diff())

    def pack(self, scheduled: list[ScheduledState], batch: InputBatch, previous_rows: dict[str, int],
             pad_to: tuple[int, int] | None = None) -> PackedStep:
        """The step's tensors; `previous_rows` gives the row in `samples` of each request whose last input is
        the previous step's sample, not on the host yet. `pad_to` (tokens, requests) pads the step to a graph's
        shape: requests of one token that write nothing, then tokens of no request; a decode graph takes those
        samples itself."""
        n = len(scheduled)
        counts = np.fromiter((item.num_new_tokens for item in scheduled), np.int64, n)
        starts = np.fromiter((item.start for item in scheduled), np.int64, n)
        rows = np.fromiter((item.state.row for item in scheduled), np.int64, n)
        t_real = int(counts.sum())
        t, b = pad_to or (t_real, n)
        decode_graph = pad_to is not None and t == b
        if t > self.max_tokens or b > self.max_reqs:
            raise ValueError(f"a step of {t} tokens and {b} requests exceeds the buffers' {self.max_tokens} and "
                             f"{self.max_reqs}")
        width = int(batch.num_blocks[rows].max())
        stage = self._set
        if self._copied[stage] is not None:
            self._copied[stage].synchronize()
        longs, all_ints = self._host[stage].numpy().view(np.int64), self._host[stage].numpy().view(np.int32)
        at = _Layout.of(t, b)
        ints = all_ints[at.ints:]

        query_start = ints[:b + 1]
        query_start[0] = 0
        np.cumsum(counts, out=query_start[1:n + 1])
        query_start[n + 1:] = np.arange(t_real + 1, t_real + b - n + 1)
        seq_lens = ints[at.seq_lens:at.seq_lens + b]
        seq_lens[:n] = starts + counts
        seq_lens[n:] = 1
        temperature = ints[at.temperature:at.temperature + b].view(np.float32)
        temperature[:n] = batch.temperature[rows]
        temperature[n:] = 0.0
        ints[at.table_shape:at.table_shape + 2] = n, width
        table_end = at.table + n * width
        table = ints[at.table:table_end].reshape(n, width)
        np.take(batch.block_table[:, :width], rows, axis=0, out=table)

        positions = longs[at.positions:at.positions + t]
        positions[:t_real] = np.repeat(starts - query_start[:n], counts) + np.arange(t_real)
        positions[t_real:] = 0
        slots = longs[at.slots:at.slots + t]
        bs = self.block_size
        owner_rows = np.repeat(rows, counts)
        slots[:t_real] = batch.block_table[owner_rows, positions[:t_real] // bs].astype(np.int64) * bs
        slots[:t_real] += positions[:t_real] % bs
        slots[t_real:] = -1
        seeds, steps = longs[at.seeds:at.seeds + b], longs[at.steps:at.steps + b]
        seeds[:n] = batch.seed[rows]
        # a sampling row's context ends with its newest token, so its output tokens so far are the context
        # past the prompt (the sampler's step); rows that do not sample draw nothing
        steps[:n] = seq_lens[:n] - batch.num_prompt_tokens[rows]
        seeds[n:] = 0
        steps[n:] = 0
        previous = longs[at.previous:at.previous + b]
        previous[:] = -1

        ids = longs[:t]
        gather_dst: list[int] = []
        gather_src: list[int] = []
        offset = 0
        for item in scheduled:
            tokens, start, k = item.state.token_ids, item.start, item.num_new_tokens
            end = start + k
            if end > len(tokens):  # the last input is the previous step's sample
                if decode_graph:  # one token a row: the graph takes it
                    previous[offset] = previous_rows[item.state.req_id]
                else:
                    gather_dst.append(offset + k - 1)
                    gather_src.append(previous_rows[item.state.req_id])
                end -= 1
            if k == 1:
                if end > start:
                    ids[offset] = tokens[start]
            else:
                ids[offset:offset + end - start] = tokens[start:end]
            offset += k
        ids[t_real:] = 0
        g, tail = len(gather_dst), at.table_end(n * width)
        longs[tail:tail + g] = gather_dst
        longs[tail + g:tail + 2 * g] = gather_src
        sampling = [i for i, item in enumerate(scheduled) if item.samples]
        every_row = t_real == n and len(sampling) == n
        num_rows = 0 if every_row else len(sampling)
        num_longs = tail + 2 * g + num_rows
        if num_rows:
            longs[tail + 2 * g:num_longs] = query_start[1:n + 1][sampling] - 1

        if self.data.device.type == "cuda":
            self.data[:8 * num_longs].copy_(self._host[stage][:8 * num_longs], non_blocking=True)
            event = self._copied[stage] = self._copied[stage] or torch.cuda.Event()
            event.record()
            self._set = (stage + 1) % len(self._copied)
        dev_longs, dev_ints = self.longs, self.ints[at.ints:]
        metadata = AttentionMetadata(
            slot_mapping=dev_longs[at.slots:at.slots + t], query_start_loc=dev_ints[:b + 1],
            seq_lens=dev_ints[at.seq_lens:at.seq_lens + b],
            block_tables=dev_ints[at.table:table_end].view(n, width), max_query_len=int(counts.max()),
            max_seq_len=int(seq_lens[:n].max()), query_start_loc_cpu=query_start.tolist(),
            seq_lens_cpu=seq_lens.tolist(), block_tables_cpu=table)
        gather = (dev_longs[tail:tail + g], dev_longs[tail + g:tail + 2 * g]) if g else None
        logit_rows = dev_longs[tail + 2 * g:num_longs] if num_rows else None
        return PackedStep(dev_longs[:t], dev_longs[at.positions:at.positions + t], metadata, gather, logit_rows, n)


class _Layout(NamedTuple):
    """Where the sections of a step of t tokens and b requests start: int64 indices, then int32 indices from `ints`
    (itself an int32 index); each a multiple of 16 bytes."""

    positions: int
    slots: int
    seeds: int
    steps: int
    previous: int
    ints: int
    seq_lens: int
    temperature: int
    table_shape: int
    table: int

    @classmethod
    def of(cls, t: int, b: int) -> _Layout:
        t2, b2, b4 = _round_up(t, 2), _round_up(b, 2), _round_up(b, 4)
        seq_lens = _round_up(b + 1, 4)
        return cls(t2, 2 * t2, 3 * t2, 3 * t2 + b2, 3 * t2 + 2 * b2, 2 * (3 * t2 + 3 * b2), seq_lens,
                   seq_lens + b4, seq_lens + 2 * b4, seq_lens + 2 * b4 + 4)

    def table_end(self, table_entries: int) -> int:
        """The int64 index of the first section after a table of `table_entries` entries."""
        return _round_up(-(-(self.ints + self.table + table_entries) // 2), 2)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple
