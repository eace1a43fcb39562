"""Pooling the hidden states of a prompt into one embedding: the first token's (CLS), the mean of all
tokens', or the last token's; then, per request, Matryoshka truncation and L2 normalisation."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from wick.pooling_params import PoolingParams


class PoolingType(enum.Enum):
    CLS = "cls"
    MEAN = "mean"
    LAST = "last"


@dataclass(frozen=True)
class PoolerConfig:
    """How a model turns hidden states into an embedding. `is_matryoshka`: requests may ask for fewer
    `dimensions` (any size up to `hidden_size`, or one of `matryoshka_dimensions` when the model lists them)."""

    pooling_type: PoolingType
    normalize: bool
    hidden_size: int
    is_matryoshka: bool = False
    matryoshka_dimensions: tuple[int, ...] | None = None

    def check(self, params: PoolingParams) -> None:
        """ValueError (starting with the field's name) for settings this model cannot honour."""
        dims = params.dimensions
        if dims is None:
            return
        if not self.is_matryoshka:
            raise ValueError("dimensions: this model does not support Matryoshka representation: its embeddings "
                             f"have {self.hidden_size} dimensions, which cannot be truncated")
        if dims > self.hidden_size:
            raise ValueError(f"dimensions: {dims} is more than the model's {self.hidden_size} dimensions")
        if self.matryoshka_dimensions and dims not in self.matryoshka_dimensions:
            raise ValueError(f"dimensions: {dims} is not one of the sizes the model supports: "
                             f"{', '.join(map(str, self.matryoshka_dimensions))}")


def pool(hidden: torch.Tensor, starts: list[int], ends: list[int], pooling_type: PoolingType) -> torch.Tensor:
    """[num_tokens, hidden] packed hidden states -> [len(starts), hidden] float32, one row per span start:end."""
    device = hidden.device
    if pooling_type is PoolingType.CLS:
        return hidden[torch.tensor(starts, device=device)].float()
    if pooling_type is PoolingType.LAST:
        return hidden[torch.tensor(ends, device=device) - 1].float()
    first, lengths = torch.tensor(starts), torch.tensor(ends) - torch.tensor(starts)
    segment = torch.repeat_interleave(torch.arange(len(starts)), lengths)  # the span of each pooled row
    # row j of the pooled rows is hidden row starts[s] + (j - where span s begins among the pooled rows)
    rows = torch.arange(len(segment)) + (first - (lengths.cumsum(0) - lengths))[segment]
    sums = torch.zeros(len(starts), hidden.shape[-1], dtype=torch.float32, device=device)
    sums.index_add_(0, segment.to(device, non_blocking=True), hidden[rows.to(device, non_blocking=True)].float())
    return sums / lengths.to(device=device, dtype=torch.float32)[:, None]


def finish(vectors: torch.Tensor, params: list[PoolingParams], normalize: bool) -> list[list[float]]:
    """Each row cut to its request's `dimensions` and normalised when the request (or else the model) says so."""
    flags = [normalize if p.normalize is None else p.normalize for p in params]
    if all(p.dimensions is None for p in params):
        if any(flags):
            mask = torch.tensor(flags, device=vectors.device)[:, None]
            vectors = torch.where(mask, F.normalize(vectors, dim=-1), vectors)
        return vectors.tolist()
    rows = []
    for row, p, flag in zip(vectors, params, flags, strict=True):
        row = row[: p.dimensions]
        rows.append(F.normalize(row, dim=-1) if flag else row)
    return [row.tolist() for row in rows]
