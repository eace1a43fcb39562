"""Token embedding and LM head split by vocabulary rows across tensor-parallel ranks.

Each rank holds ceil(vocab / tp_size) rows; the last rank's tail past the real vocabulary is
zero padding, cut off from the logits.

GGUF checkpoints may leave both packed (as the quantization config says): the embedding then
dequantizes the rows it gathers, and the head runs the packed matmul of the linear layers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from wick.distributed.communication import tp_all_gather_last_dim, tp_all_reduce, tp_rank, tp_world_size
from wick.layers.quantization.base import current_quantization
from wick.layers.quantization.gguf import GGUFWeight, gguf_embedding, gguf_linear
from wick.layers.quantization.unquantized import dense_linear


class VocabParallelEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.tp_rank = tp_rank()
        self.tp_size = tp_world_size()
        self.num_embeddings = num_embeddings
        self.rows_per_rank = -(-num_embeddings // self.tp_size)
        self.vocab_start = self.tp_rank * self.rows_per_rank
        self.vocab_end = min(self.vocab_start + self.rows_per_rank, num_embeddings)
        self.embedding_dim = embedding_dim
        self.params_dtype = torch.get_default_dtype()
        config = current_quantization()
        # A packed checkpoint replaces the parameter's data at load: no full-size placeholder.
        shape = (0,) if config is not None and config.packs_gguf() else (self.rows_per_rank, embedding_dim)
        self.weight = nn.Parameter(torch.zeros(shape), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor | GGUFWeight,
                      shard_id: None = None) -> None:
        if loaded_weight.shape[0] != self.num_embeddings:
            raise ValueError(f"vocab size mismatch: model {self.num_embeddings}, checkpoint {loaded_weight.shape[0]}")
        rows = self.vocab_end - self.vocab_start
        if isinstance(loaded_weight, GGUFWeight):
            self._load_packed(param, loaded_weight.rows(self.vocab_start, rows))
            return
        param.data[:rows].copy_(loaded_weight[self.vocab_start : self.vocab_end])
        param.data[rows:].zero_()

    def _load_packed(self, param: nn.Parameter, part: GGUFWeight) -> None:
        data = part.data.to(param.device)
        if part.shape[0] < self.rows_per_rank:
            # Zero bytes decode to zeros in every GGUF type.
            padding = data.new_zeros(self.rows_per_rank - part.shape[0], data.shape[1])
            data = torch.cat([data, padding])
        param.data = data
        param.gguf = GGUFWeight(data, part.qtype, (self.rows_per_rank, self.embedding_dim))

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        packed = getattr(self.weight, "gguf", None)
        if packed is not None:
            return gguf_embedding(ids, packed, self.params_dtype)
        return F.embedding(ids, self.weight)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self._embed(input_ids)
        mine = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)
        local_ids = torch.where(mine, input_ids - self.vocab_start, 0)
        x = self._embed(local_ids)
        x = x * mine.unsqueeze(-1).to(x.dtype)
        return tp_all_reduce(x)


class ParallelLMHead(VocabParallelEmbedding):
    """hidden [N, dim] -> logits [N, vocab], gathered from all ranks."""

    def process_weights_after_loading(self) -> None:
        """A packed head on the CPU gets its CPU kernel form (a tied embedding keeps reading the packed rows)."""
        packed = getattr(self.weight, "gguf", None)
        if packed is not None:
            self.weight.gguf = packed.with_cpu_kernel(logits=True)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        packed = getattr(self.weight, "gguf", None)
        local = gguf_linear(hidden_states, packed) if packed is not None else dense_linear(hidden_states, self.weight)
        logits = tp_all_gather_last_dim(local)
        return logits[..., : self.num_embeddings]
