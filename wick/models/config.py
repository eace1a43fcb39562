"""The model config, normalised once from a Hugging Face config: what the shared blocks read.

HF configs name the same idea many ways (num_local_experts / num_experts / n_routed_experts,
rope_theta / rope_parameters, per-layer `layer_types` / `max_window_layers`); the blocks see one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from transformers import PretrainedConfig

from wick.layers.rotary import rope_parameters


@dataclass(frozen=True)
class RopeSpec:
    theta: float
    scaling: dict[str, Any] | None  # as rope_parameters() returns it; None for plain RoPE
    rotary_dim: int  # the leading dims of each head that rotate (partial RoPE when < head_dim)
    is_neox: bool = True  # False: GPT-J style, dims (2i, 2i+1) rotate together


@dataclass(frozen=True)
class MoeSpec:
    num_experts: int
    top_k: int
    intermediate_size: int
    renormalize: bool
    scoring: str = "softmax"  # or "sigmoid" (DeepSeek V3)
    num_expert_group: int | None = None
    topk_group: int | None = None
    group_score: str = "max"  # DeepSeek V2 "max"; V3 "top2_sum" (with the correction bias)
    routed_scaling_factor: float = 1.0
    correction_bias: bool = False
    shared_intermediate_size: int = 0  # 0: no shared expert
    shared_expert_gate: bool = False  # Qwen2-MoE: sigmoid(x W) scales the shared expert's output


@dataclass(frozen=True)
class MlaSpec:
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    hidden_act: str
    norm_eps: float
    max_position: int
    tie_word_embeddings: bool
    rope: list[RopeSpec]  # per layer
    sliding_window: list[int | None]  # per layer: keys a query sees, itself included; None: all
    attn_scale: float
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    moe: MoeSpec | None = None
    moe_layers: list[bool] = field(default_factory=list)  # per layer: True where the MLP is the MoE
    mla: MlaSpec | None = None

    @classmethod
    def from_hf(cls, config: PretrainedConfig, **overrides: Any) -> ModelConfig:
        """The normalised config; a family passes what its HF config does not say (e.g. is_neox)."""
        num_heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
        num_layers = config.num_hidden_layers
        attention_bias = bool(getattr(config, "attention_bias", False))
        moe = _moe_spec(config)
        values: dict[str, Any] = dict(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or num_heads,
            head_dim=head_dim,
            intermediate_size=getattr(config, "intermediate_size", 0),
            hidden_act=getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu"),
            norm_eps=getattr(config, "rms_norm_eps", None) or getattr(config, "layer_norm_eps", None) or 1e-6,
            max_position=int(getattr(config, "max_position_embeddings", None) or 4096),
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            rope=_rope_specs(config, head_dim, num_layers),
            sliding_window=sliding_windows(config),
            attn_scale=head_dim**-0.5,
            attn_logit_softcap=getattr(config, "attn_logit_softcapping", None),
            final_logit_softcap=getattr(config, "final_logit_softcapping", None),
            qkv_bias=attention_bias,
            o_bias=attention_bias,
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
            moe=moe,
            moe_layers=_moe_layers(config, num_layers) if moe is not None else [False] * num_layers,
        )
        values.update(overrides)
        return cls(**values)


# multimodal checkpoints whose language model wick serves alone (text in, text out)
_LANGUAGE_MODELS = {"Gemma3ForConditionalGeneration": "Gemma3ForCausalLM"}


def language_model_config(config: PretrainedConfig) -> PretrainedConfig:
    """For a multimodal checkpoint wick serves as text only (Gemma 3 4B-27B): its text config, named
    as the text model; any other config unchanged."""
    architectures = getattr(config, "architectures", None) or []
    text_arch = next((_LANGUAGE_MODELS[a] for a in architectures if a in _LANGUAGE_MODELS), None)
    if text_arch is None:
        return config
    text = config.text_config
    text.architectures = [text_arch]
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "dtype"):
        if getattr(config, key, None) is not None:
            setattr(text, key, getattr(config, key))
    return text


def sliding_windows(config: PretrainedConfig) -> list[int | None]:
    """Each layer's attention window: HF's `layer_types` where the config has them, else the one
    `sliding_window` for every layer (Mistral-7B-v0.1) unless `use_sliding_window` is False."""
    num_layers = config.num_hidden_layers
    window = getattr(config, "sliding_window", None) or None
    if window is None or getattr(config, "use_sliding_window", True) is False:
        return [None] * num_layers
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        return [int(window) if kind == "sliding_attention" else None for kind in layer_types]
    return [int(window)] * num_layers


def common_window(config: PretrainedConfig) -> int | None:
    """The widest layer's window when every layer slides (Mistral-7B-v0.1), else None: keys out of it
    are seen by no layer, so their KV blocks can be released."""
    windows = sliding_windows(config)
    if not windows or any(w is None for w in windows):
        return None
    return max(w for w in windows if w is not None)


def _rope_specs(config: PretrainedConfig, head_dim: int, num_layers: int) -> list[RopeSpec]:
    params = getattr(config, "rope_parameters", None) or {}
    layer_types = getattr(config, "layer_types", None) or ["full_attention"] * num_layers
    per_type = isinstance(params, dict) and any(isinstance(v, dict) for v in params.values())
    specs = []
    for kind in layer_types:
        source = config
        if per_type:  # Gemma 3: {"sliding_attention": {...}, "full_attention": {...}}
            source = _ConfigView(config, params[kind])
        theta, scaling = rope_parameters(source)
        partial = (getattr(source, "rope_parameters", None) or {}).get("partial_rotary_factor") \
            or getattr(config, "partial_rotary_factor", None) or 1.0
        if scaling is not None:
            scaling.pop("partial_rotary_factor", None)
            if scaling["rope_type"] == "longrope":
                scaling.setdefault("original_max_position_embeddings",
                                   getattr(config, "original_max_position_embeddings", None))
                scaling.setdefault("max_position_embeddings", config.max_position_embeddings)
        specs.append(RopeSpec(theta, scaling, int(head_dim * partial)))
    return specs


class _ConfigView:
    """One layer type's rope parameters, seen as a config of its own."""

    def __init__(self, config: PretrainedConfig, rope: dict[str, Any]) -> None:
        self.rope_parameters = rope
        self.rope_theta = rope.get("rope_theta")
        self.partial_rotary_factor = getattr(config, "partial_rotary_factor", None)


def _moe_spec(config: PretrainedConfig) -> MoeSpec | None:
    num_experts = (getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
                   or getattr(config, "n_routed_experts", None))
    if not num_experts:
        return None
    shared = getattr(config, "shared_expert_intermediate_size", 0) or 0
    n_shared = getattr(config, "n_shared_experts", None) or 0
    moe_size = getattr(config, "moe_intermediate_size", None) or config.intermediate_size
    if n_shared:
        shared = n_shared * moe_size
    topk_method = getattr(config, "topk_method", None)
    scoring = getattr(config, "scoring_func", None) or ("sigmoid" if topk_method == "noaux_tc" else "softmax")
    model_type = getattr(config, "model_type", "")
    grouped = topk_method in ("group_limited_greedy", "noaux_tc") or model_type == "deepseek_v3"
    if model_type == "deepseek_v3":
        scoring = "sigmoid"
    return MoeSpec(
        num_experts=int(num_experts),
        top_k=int(config.num_experts_per_tok),
        intermediate_size=int(moe_size),
        # Mixtral always renormalises; the others say so in norm_topk_prob
        renormalize=bool(getattr(config, "norm_topk_prob", model_type == "mixtral")),
        scoring=scoring,
        num_expert_group=getattr(config, "n_group", None) if grouped else None,
        topk_group=getattr(config, "topk_group", None) if grouped else None,
        group_score="top2_sum" if scoring == "sigmoid" else "max",
        routed_scaling_factor=float(getattr(config, "routed_scaling_factor", None) or 1.0),
        correction_bias=scoring == "sigmoid",
        shared_intermediate_size=int(shared),
        shared_expert_gate=bool(getattr(config, "shared_expert_intermediate_size", 0)),
    )


def _moe_layers(config: PretrainedConfig, num_layers: int) -> list[bool]:
    step = getattr(config, "decoder_sparse_step", None) or getattr(config, "moe_layer_freq", None) or 1
    dense = set(getattr(config, "mlp_only_layers", None) or [])
    first_dense = getattr(config, "first_k_dense_replace", None) or 0
    return [i not in dense and (i + 1) % step == 0 and i >= first_dense for i in range(num_layers)]
