"""The model runner's embedding requests: an encoder's step (whole prompts, no KV cache) and the embeddings
of the requests whose prompt a step completed."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from wick.layers.attention.backend import AttentionBackend
from wick.layers.attention.metadata import AttentionMetadata, set_forward_context
from wick.layers.pooler import PoolerConfig, PoolingType, finish, pool
from wick.pooling_params import PoolingParams
from wick.worker.input_batch import ScheduledState


@dataclass
class PooledBatch:
    """The pooled rows of one step, still on the device (the forward may be running)."""

    req_ids: list[str]
    params: list[PoolingParams]
    vectors: torch.Tensor  # [len(req_ids), hidden] float32
    normalize: bool

    def outputs(self) -> dict[str, list[float]]:
        """Each request's embedding, cut and normalised as it asked (waits for the forward)."""
        return dict(zip(self.req_ids, finish(self.vectors, self.params, self.normalize), strict=True))


def pool_scheduled(config: PoolerConfig, hidden: torch.Tensor, scheduled: list[ScheduledState],
                   query_start: list[int]) -> PooledBatch | None:
    """Pools the rows of the scheduled requests that complete their prompt this step; None when none does."""
    rows = [i for i, item in enumerate(scheduled) if item.pools]
    if not rows:
        return None
    if config.pooling_type is not PoolingType.LAST and any(scheduled[i].start for i in rows):
        raise RuntimeError("a prompt pooled over all its tokens must run in one step")
    vectors = pool(hidden, [query_start[i] for i in rows], [query_start[i + 1] for i in rows], config.pooling_type)
    states = [scheduled[i].state for i in rows]
    return PooledBatch([s.req_id for s in states], [s.pooling_params for s in states], vectors, config.normalize)


def run_encoder(model: nn.Module, backend: AttentionBackend, scheduled: list[ScheduledState],
                device: torch.device) -> tuple[torch.Tensor, list[int]]:
    """One step of a model without a KV cache: every scheduled request is a whole prompt. Returns the hidden
    states [num_tokens, hidden] and where each request's rows start (and the last one ends)."""
    input_ids: list[int] = []
    positions: list[int] = []
    query_start = [0]
    for item in scheduled:
        start, end = item.start, item.start + item.num_new_tokens
        input_ids.extend(item.state.token_ids[start:end])
        positions.extend(range(start, end))
        query_start.append(query_start[-1] + item.num_new_tokens)
    lengths = [item.num_new_tokens for item in scheduled]
    pinned = device.type == "cuda"

    def to_device(values: list[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, pin_memory=pinned).to(device, non_blocking=True)

    empty = torch.empty(0, dtype=torch.int32, device=device)
    metadata = AttentionMetadata(
        slot_mapping=empty.long(), query_start_loc=to_device(query_start, torch.int32),
        seq_lens=to_device(lengths, torch.int32), block_tables=empty[None], max_query_len=max(lengths),
        max_seq_len=max(lengths), query_start_loc_cpu=query_start, seq_lens_cpu=lengths)
    with set_forward_context(metadata, backend):
        hidden = model(to_device(input_ids, torch.long), to_device(positions, torch.long))
    return hidden, query_start
