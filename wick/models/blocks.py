"""The shared blocks every family is built from, over a packed batch (one flat token dimension).

A decoder layer is attention then an MLP, each behind a norm; families differ in which extra norms sit
around them (Gemma's sandwich, GLM-4's post norms), in the norm itself, and in the MLP (gated, or a
mixture of experts). The residual add is fused into the norm that follows it, and so is the norm of a
sublayer's output before the add where the family has one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from wick.distributed.communication import PartialSum
from wick.layers.activation import get_act_and_mul
from wick.layers.attention.layer import Attention
from wick.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from wick.layers.moe.fused_moe import FusedMoE, RouterLinear
from wick.layers.pending_norm import PendingNorm, resolved
from wick.layers.rotary import RotaryEmbedding, get_rope
from wick.layers.vocab_embedding import VocabParallelEmbedding
from wick.models.config import ModelConfig, MoeSpec, RopeSpec

if TYPE_CHECKING:
    from wick.kernels.pair_sum import PairRows


@dataclass(frozen=True)
class NormLayout:
    """Checkpoint names of a decoder layer's norms; None where the family has no such norm."""

    pre_attn: str = "input_layernorm"
    post_attn: str | None = None  # on the attention output, before the residual add
    pre_mlp: str = "post_attention_layernorm"
    post_mlp: str | None = None  # on the MLP output, before the residual add


GEMMA_NORMS = NormLayout(post_attn="post_attention_layernorm", pre_mlp="pre_feedforward_layernorm",
                         post_mlp="post_feedforward_layernorm")
GLM4_NORMS = NormLayout(post_attn="post_self_attn_layernorm", post_mlp="post_mlp_layernorm")


class RopeCache:
    """One RotaryEmbedding per distinct RoPE spec, shared by the layers that use it."""

    def __init__(self, head_dim: int, max_position: int) -> None:
        self.head_dim = head_dim
        self.max_position = max_position
        self._made: dict[str, RotaryEmbedding] = {}

    def get(self, spec: RopeSpec) -> RotaryEmbedding:
        key = repr(spec)
        if key not in self._made:
            self._made[key] = get_rope(self.head_dim, self.max_position, spec.theta, spec.scaling,
                                       rotary_dim=spec.rotary_dim, is_neox=spec.is_neox)
        return self._made[key]


class GatedMLP(nn.Module):
    reads_pending_norm = True  # its input reaches only gate_up_proj (layers.pending_norm)
    leaves_all_reduce = True  # forward(reduce=False): its output before the all-reduce (PartialSum)

    def __init__(self, hidden_size: int, intermediate_size: int, act: str, bias: bool = False) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2, bias=bias)
        self.act_fn = get_act_and_mul(act)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor | PendingNorm, reduce: bool = True) -> torch.Tensor | PartialSum:
        pending = self.down_proj.quant_method.reads_pending_rows
        return self.down_proj(self.gate_up_proj.gated(x, self.act_fn, pending=pending), reduce)


class SparseMoeBlock(nn.Module):
    """Router, routed experts and, where the family has them, shared experts (always on)."""

    reads_pending_norm = True  # the router reads it first, the rest its normed row (layers.pending_norm)

    def __init__(self, spec: MoeSpec, hidden_size: int, act: str, shared_name: str = "shared_expert") -> None:
        super().__init__()
        if act not in ("silu", "swish"):
            raise ValueError(f"unsupported expert activation {act!r}: only silu")
        self.gate = RouterLinear(hidden_size, spec.num_experts, spec.correction_bias)
        self.experts = FusedMoE(spec, hidden_size)
        self.shared_name = shared_name if spec.shared_intermediate_size else None
        if self.shared_name is not None:
            setattr(self, shared_name, GatedMLP(hidden_size, spec.shared_intermediate_size, act))
        self.shared_expert_gate = RouterLinear(hidden_size, 1) if spec.shared_expert_gate else None

    def forward(self, x: torch.Tensor | PendingNorm) -> torch.Tensor | PairRows:
        """Without shared experts, quantized experts may leave their pairs unsummed, for the next norm to sum."""
        router_logits = self.gate(x)
        x = resolved(x)
        out = self.experts(x, router_logits, self.gate.e_score_correction_bias, unsummed=self.shared_name is None)
        if self.shared_name is not None:
            shared = getattr(self, self.shared_name)(x)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
        return out


class DecoderAttention(nn.Module):
    """Grouped-query attention with RoPE, this layer's window and soft-cap; optional per-head q/k norms."""

    reads_pending_norm = True  # its input reaches only qkv_proj (layers.pending_norm)
    leaves_all_reduce = True  # forward(reduce=False): its output before the all-reduce (PartialSum)

    def __init__(self, cfg: ModelConfig, layer: int, rope: RotaryEmbedding, qk_norm: type[nn.Module] | None = None
                 ) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        self.qkv_proj = QKVParallelLinear(cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads,
                                          bias=cfg.qkv_bias)
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=cfg.o_bias)
        self.rotary_emb = rope
        self.attn = Attention(self.num_heads, self.head_dim, cfg.attn_scale, self.num_kv_heads,
                              cfg.sliding_window[layer], cfg.attn_logit_softcap)
        self.qk_norm = qk_norm is not None
        if qk_norm is not None:
            self.q_norm = qk_norm(self.head_dim, cfg.norm_eps)
            self.k_norm = qk_norm(self.head_dim, cfg.norm_eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor | PendingNorm, reduce: bool = True
                ) -> torch.Tensor | PartialSum:
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = self.qkv_proj(hidden_states).split([q_size, kv_size, kv_size], dim=-1)
        norms = (self.q_norm, self.k_norm) if self.qk_norm else None
        pending = self.o_proj.quant_method.reads_pending_rows  # layers.pending_combine
        return self.o_proj(self.attn.rotate_and_attend(positions, q, k, v, self.rotary_emb, norms, pending), reduce)


def _unreduced(sublayer: nn.Module, post_norm: str | None) -> dict[str, bool]:
    """The sublayer's arguments that leave its all-reduce to the norm after it (PartialSum): where it can and no
    norm of its own output comes first."""
    return {"reduce": False} if getattr(sublayer, "leaves_all_reduce", False) and post_norm is None else {}


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, attn: nn.Module, mlp: nn.Module, norm: type[nn.Module],
                 layout: NormLayout) -> None:
        super().__init__()
        self.self_attn = attn
        self.mlp = mlp
        self.layout = layout
        for name in (layout.pre_attn, layout.post_attn, layout.pre_mlp, layout.post_mlp):
            if name is not None:
                setattr(self, name, norm(cfg.hidden_size, cfg.norm_eps))

    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor | PairRows | PartialSum,
        residual: torch.Tensor | None, x_norm: nn.Module | None = None,
    ) -> tuple[torch.Tensor | PairRows | PartialSum, torch.Tensor]:
        """x_norm: the previous layer's post-MLP norm, still to be applied to hidden_states. Returns (the MLP's
        output, before this layer's post-MLP norm, and the residual stream before it): the next norm applies
        the post-MLP norm and adds them, in one kernel on CUDA, or leaves them to the sublayer that reads them
        where it takes a pending norm (layers.pending_norm). An MoE block's output may be its pairs unsummed
        (kernels/pair_sum.PairRows), which that norm's kernel sums; a sublayer's output over several ranks may be
        left before its all-reduce (PartialSum), which that norm sums too."""
        layout = self.layout
        pre_attn = getattr(self, layout.pre_attn)
        if residual is None:
            residual = hidden_states
            hidden_states = pre_attn(hidden_states)
        else:
            hidden_states, residual = pre_attn(hidden_states, residual, x_norm,
                                               pending=getattr(self.self_attn, "reads_pending_norm", False))
        hidden_states = self.self_attn(positions, hidden_states, **_unreduced(self.self_attn, layout.post_attn))
        post_attn = getattr(self, layout.post_attn) if layout.post_attn is not None else None
        hidden_states, residual = getattr(self, layout.pre_mlp)(
            hidden_states, residual, post_attn, pending=getattr(self.mlp, "reads_pending_norm", False))
        return self.mlp(hidden_states, **_unreduced(self.mlp, layout.post_mlp)), residual

    @property
    def post_mlp_norm(self) -> nn.Module | None:
        return getattr(self, self.layout.post_mlp) if self.layout.post_mlp is not None else None


class DecoderModel(nn.Module):
    """Embedding (scaled by sqrt(hidden) where the family says so), the layers, the final norm."""

    def __init__(self, cfg: ModelConfig, layers: list[nn.Module], norm: type[nn.Module],
                 embed_scale: bool = False) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_scale = cfg.hidden_size**0.5 if embed_scale else None
        self.layers = nn.ModuleList(layers)
        self.norm = norm(cfg.hidden_size, cfg.norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids)
        if self.embed_scale is not None:
            # as HF does: the scale rounded to the weights' dtype first
            hidden_states = hidden_states * torch.tensor(self.embed_scale, dtype=hidden_states.dtype)
        residual = x_norm = None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual, x_norm)
            x_norm = layer.post_mlp_norm
        hidden_states, _ = self.norm(hidden_states, residual, x_norm)
        return hidden_states
