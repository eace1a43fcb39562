"""BERT-family encoders as embedding models (BertModel: sentence-transformers' MiniLM, BGE, E5...).

Absolute position embeddings, token type 0 for every token, post-LayerNorm layers with GELU, and bidirectional
attention within each sequence of the packed batch: no paged KV cache, so every prompt runs whole in one step.
The model returns the last layer's hidden states; the pooler (wick/layers/pooler.py) makes the embedding.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from wick.layers.attention.encoder import PaddedLayout, VarlenLayout, encoder_layout
from wick.layers.attention.metadata import get_forward_context
from wick.layers.linear import ColumnParallelLinear, QKVParallelLinear, RowParallelLinear, default_weight_loader
from wick.layers.norm import LayerNorm
from wick.layers.vocab_embedding import VocabParallelEmbedding
from wick.models.base import _our_name

_STACKED = {"query": ("qkv_proj", "q"), "key": ("qkv_proj", "k"), "value": ("qkv_proj", "v")}
# Checkpoint tensors an embedding model does not use: BERT's pooler head (tanh over CLS), the MLM head, buffers.
_UNUSED = ("pooler.", "cls.", "embeddings.position_ids")


class _Table(nn.Module):
    """A small embedding table every rank holds whole (positions, token types)."""

    def __init__(self, rows: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(rows, dim), requires_grad=False)
        self.weight.weight_loader = default_weight_loader


class BertEmbeddings(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.word_embeddings = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = _Table(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = _Table(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = LayerNorm(config.hidden_size, config.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = (self.word_embeddings(input_ids) + self.position_embeddings.weight[positions]
             + self.token_type_embeddings.weight[0])
        return self.LayerNorm(x)


class BertSelfAttention(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.qkv_proj = QKVParallelLinear(config.hidden_size, self.head_dim, config.num_attention_heads,
                                          config.num_attention_heads, bias=True)
        self.num_heads = self.qkv_proj.num_heads

    def forward(self, x: torch.Tensor, layout: PaddedLayout | VarlenLayout) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).view(-1, 3, self.num_heads, self.head_dim).unbind(1)
        return layout.attend(q, k, v, self.head_dim**-0.5).flatten(1)


class BertOutput(nn.Module):
    """dense, then LayerNorm of (the result + the sublayer's input): BERT's post-norm residual."""

    def __init__(self, input_size: int, config: PretrainedConfig) -> None:
        super().__init__()
        self.dense = RowParallelLinear(input_size, config.hidden_size, bias=True)
        self.LayerNorm = LayerNorm(config.hidden_size, config.layer_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(config)  # the checkpoint's name
        self.output = BertOutput(config.hidden_size, config)

    def forward(self, x: torch.Tensor, layout: PaddedLayout | VarlenLayout) -> torch.Tensor:
        return self.output(self.self(x, layout), x)


class BertIntermediate(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        if config.hidden_act not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"unsupported BERT activation {config.hidden_act!r}: gelu only")
        self.approximate = "none" if config.hidden_act == "gelu" else "tanh"
        self.dense = ColumnParallelLinear(config.hidden_size, config.intermediate_size, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(x), approximate=self.approximate)


class BertLayer(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config.intermediate_size, config)

    def forward(self, x: torch.Tensor, layout: PaddedLayout | VarlenLayout) -> torch.Tensor:
        x = self.attention(x, layout)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, x: torch.Tensor, layout: PaddedLayout | VarlenLayout) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x, layout)
        return x


class BertModel(nn.Module):
    """input_ids, positions [num_tokens] of whole sequences (the step's query_start_loc says where each
    starts) -> the last layer's hidden states [num_tokens, hidden]."""

    supports_cuda_graph = False

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        if getattr(config, "position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"unsupported BERT position embeddings {config.position_embedding_type!r}: "
                             "absolute only")
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        layout = encoder_layout(get_forward_context().attn_metadata.query_start_loc_cpu, input_ids.device,
                                self.embeddings.position_embeddings.weight.dtype)
        return self.encoder(self.embeddings(input_ids, positions), layout)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Loads a BertModel checkpoint (or a BertFor* one, whose names start with `bert.`)."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for checkpoint_name, tensor in weights:
            name = checkpoint_name.removeprefix("bert.")
            if name.startswith(_UNUSED):
                continue
            name, shard_id = _our_name(name, _STACKED)
            if name not in params:
                raise KeyError(f"checkpoint tensor {checkpoint_name!r} has no parameter in {type(self).__name__}")
            param = params[name]
            param.weight_loader(param, tensor, shard_id)
            loaded.add(name)
        return loaded
