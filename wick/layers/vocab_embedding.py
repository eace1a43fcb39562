"""Token embedding and LM head split by vocabulary rows across tensor-parallel ranks.

Each rank holds ceil(vocab / tp_size) rows; the last rank's tail past the real vocabulary is
zero padding, cut off from the logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from wick.distributed.communication import tp_all_gather_last_dim, tp_all_reduce, tp_rank, tp_world_size


class VocabParallelEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.tp_rank = tp_rank()
        self.tp_size = tp_world_size()
        self.num_embeddings = num_embeddings
        self.rows_per_rank = -(-num_embeddings // self.tp_size)
        self.vocab_start = self.tp_rank * self.rows_per_rank
        self.vocab_end = min(self.vocab_start + self.rows_per_rank, num_embeddings)
        self.weight = nn.Parameter(torch.zeros(self.rows_per_rank, embedding_dim), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: None = None) -> None:
        if loaded_weight.shape[0] != self.num_embeddings:
            raise ValueError(f"vocab size mismatch: model {self.num_embeddings}, checkpoint {loaded_weight.shape[0]}")
        rows = self.vocab_end - self.vocab_start
        param.data[:rows].copy_(loaded_weight[self.vocab_start : self.vocab_end])
        param.data[rows:].zero_()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        mine = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)
        local_ids = torch.where(mine, input_ids - self.vocab_start, 0)
        x = F.embedding(local_ids, self.weight) * mine.unsqueeze(-1).to(self.weight.dtype)
        return tp_all_reduce(x)


class ParallelLMHead(VocabParallelEmbedding):
    """hidden [N, dim] -> logits [N, vocab], gathered from all ranks."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = tp_all_gather_last_dim(F.linear(hidden_states, self.weight))
        return logits[..., : self.num_embeddings]
