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
    count t and request count b (padding rows included). As int64: input ids [0, t), positions [t, 2t), slots
    [2t, 3t), the requests' seeds [3t, 3t + b), sampling steps (output tokens before this one) [3t + b, 3t + 2b)
    and previous rows [3t + 2b, 3t + 3b) (see GraphInputs). Then as int32, from int32 index 2 (3t + 3b):
    query_start_loc (b + 1), seq_lens (b), the temperatures' float32 bits (b), the block table's rows and width (2)
    and the table. Then, as int64 again, the gather targets, their sources and the rows that sample. A graph of t
    tokens and b requests (a decode graph: t = b; a prefill graph: one request) is captured on those sections, so
    packing a step of that shape is all its replay needs: the graph copies the block table into its own and a decode
    graph takes the previous step's tokens from `samples` (kernels.decode_inputs); other steps gather them
    themselves (PackedStep.gather).

    `samples` holds the newest step's sampled tokens, a row per request that sampled, for the next step.

    On a GPU the host arrays are pinned and come in two sets used in turn, so that packing a step never
    overwrites a set whose copy the device has not made yet (one step is in flight while the next packs)."""

    def __init__(self, max_tokens: int, max_reqs: int, max_blocks: int, block_size: int,
                 device: torch.device) -> None:
        self.block_size = block_size
        self.max_tokens, self.max_reqs = max_tokens, max_reqs
        max_ints = 3 * max_reqs + 3 + max_reqs * max_blocks
        num_longs = 3 * max_tokens + 3 * max_reqs + -(-max_ints // 2) + 3 * max_reqs
        on_gpu = device.type == "cuda"
        sets = 2 if on_gpu else 1
        self._host = [torch.zeros(8 * num_longs, dtype=torch.uint8, pin_memory=on_gpu) for _ in range(sets)]
        self._copied: list[torch.cuda.Event | None] = [None] * sets
        self._set = 0
        self.data = torch.zeros(8 * num_longs, dtype=torch.uint8, device=device) if on_gpu else self._host[0]
        self.longs, self.ints = self.data.view(torch.int64), self.data.view(torch.int32)
        self.samples = torch.zeros(max_reqs, dtype=torch.int64, device=device)

    def views(self, tokens: int, reqs: int) -> GraphInputs:
        longs, t, b = self.longs, tokens, reqs
        ints = self.ints[_int32_start(t, b):]
        return GraphInputs(longs[:t], longs[t:2 * t], longs[2 * t:3 * t], ints[:b + 1], ints[b + 1:2 * b + 1],
                           ints[2 * b + 1:3 * b + 1].view(torch.float32), longs[3 * t:3 * t + b],
                           longs[3 * t + b:3 * t + 2 * b], longs[3 * t + 2 * b:3 * t + 3 * b],
                           ints[3 * b + 1:3 * b + 3], ints[3 * b + 3:])

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
        ints_at = _int32_start(t, b)
        ints = all_ints[ints_at:]

        query_start = ints[:b + 1]
        query_start[0] = 0
        np.cumsum(counts, out=query_start[1:n + 1])
        query_start[n + 1:] = np.arange(t_real + 1, t_real + b - n + 1)
        seq_lens = ints[b + 1:2 * b + 1]
        seq_lens[:n] = starts + counts
        seq_lens[n:] = 1
        temperature = ints[2 * b + 1:3 * b + 1].view(np.float32)
        temperature[:n] = batch.temperature[rows]
        temperature[n:] = 0.0
        ints[3 * b + 1:3 * b + 3] = n, width
        num_ints = 3 * b + 3 + n * width
        table = ints[3 * b + 3:num_ints].reshape(n, width)
        np.take(batch.block_table[:, :width], rows, axis=0, out=table)

        positions = longs[t:2 * t]
        positions[:t_real] = np.repeat(starts - query_start[:n], counts) + np.arange(t_real)
        positions[t_real:] = 0
        slots = longs[2 * t:3 * t]
        bs = self.block_size
        owner_rows = np.repeat(rows, counts)
        slots[:t_real] = batch.block_table[owner_rows, positions[:t_real] // bs].astype(np.int64) * bs
        slots[:t_real] += positions[:t_real] % bs
        slots[t_real:] = -1
        seeds, steps = longs[3 * t:3 * t + b], longs[3 * t + b:3 * t + 2 * b]
        seeds[:n] = batch.seed[rows]
        # a sampling row's context ends with its newest token, so its output tokens so far are the context
        # past the prompt (the sampler's step); rows that do not sample draw nothing
        steps[:n] = seq_lens[:n] - batch.num_prompt_tokens[rows]
        seeds[n:] = 0
        steps[n:] = 0
        previous = longs[3 * t + 2 * b:3 * t + 3 * b]
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
        g, tail = len(gather_dst), -(-(ints_at + num_ints) // 2)
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
        dev_longs, dev_ints = self.longs, self.ints[ints_at:]
        metadata = AttentionMetadata(
            slot_mapping=dev_longs[2 * t:3 * t], query_start_loc=dev_ints[:b + 1], seq_lens=dev_ints[b + 1:2 * b + 1],
            block_tables=dev_ints[3 * b + 3:num_ints].view(n, width), max_query_len=int(counts.max()),
            max_seq_len=int(seq_lens[:n].max()), query_start_loc_cpu=query_start.tolist(),
            seq_lens_cpu=seq_lens.tolist(), block_tables_cpu=table)
        gather = (dev_longs[tail:tail + g], dev_longs[tail + g:tail + 2 * g]) if g else None
        logit_rows = dev_longs[tail + 2 * g:num_longs] if num_rows else None
        return PackedStep(dev_longs[:t], dev_longs[t:2 * t], metadata, gather, logit_rows, n)


def _int32_start(t: int, b: int) -> int:
    """Where the int32 sections of a step of t tokens and b requests start, as an int32 index: after the
    three int64 sections of t and three of b."""
    return 2 * (3 * t + 3 * b)
