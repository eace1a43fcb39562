"""Small random-weight configs of each supported architecture, HF models built from them as oracles,
and ours loaded from those."""

from __future__ import annotations

import torch
from transformers import (
    AutoModelForCausalLM,
    DeepseekV2Config,
    DeepseekV3Config,
    Gemma2Config,
    Gemma3TextConfig,
    Glm4Config,
    LlamaConfig,
    MistralConfig,
    MixtralConfig,
    Phi3Config,
    PretrainedConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2MoeConfig,
    Qwen3Config,
    Qwen3MoeConfig,
    StableLmConfig,
)

from wick.models.registry import get_model_class

_COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    initializer_range=0.3,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=None,  # no early stop and no EOS masking: we decode a fixed number of tokens
    pad_token_id=0,
)

_GEMMA = dict(
    {**_COMMON, "tie_word_embeddings": True, "num_hidden_layers": 4},
    head_dim=16,
    query_pre_attn_scalar=24,
    sliding_window=8,
    layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    hidden_activation="gelu_pytorch_tanh",
)

_MLA = dict(
    {**_COMMON, "num_key_value_heads": 4},
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=16,
    v_head_dim=24,
    moe_intermediate_size=32,
    first_k_dense_replace=1,
)


def hf_configs() -> dict[str, PretrainedConfig]:
    llama3_rope = {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    }
    return {
        "llama3": LlamaConfig(**_COMMON, rope_parameters=llama3_rope),
        "llama_tied_bias": LlamaConfig(
            **{**_COMMON, "tie_word_embeddings": True}, attention_bias=True, mlp_bias=True, head_dim=32
        ),
        "mistral": MistralConfig(**_COMMON, head_dim=32, sliding_window=None),
        "qwen2": Qwen2Config(**_COMMON),
        "qwen3": Qwen3Config(**_COMMON, head_dim=32),
        # a window of 8 keys: every prompt and the decode run past it
        "mistral_window": MistralConfig(**_COMMON, head_dim=16, sliding_window=8),
        "gemma2": Gemma2Config(**_GEMMA, attn_logit_softcapping=5.0, final_logit_softcapping=30.0),
        "gemma3": Gemma3TextConfig(**_GEMMA, rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 100000.0}}),
        "phi3_longrope": Phi3Config(**{**_COMMON, "max_position_embeddings": 128}, sliding_window=None,
                                    rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                                     "partial_rotary_factor": 0.75,
                                                     "original_max_position_embeddings": 32,
                                                     "short_factor": [1.0 + 0.1 * i for i in range(6)],
                                                     "long_factor": [2.0 + 0.5 * i for i in range(6)]}),
        "glm4": Glm4Config(**_COMMON, head_dim=32),
        "stablelm": StableLmConfig(**{k: v for k, v in _COMMON.items() if k != "rms_norm_eps"},
                                   layer_norm_eps=1e-5, use_qkv_bias=True),
        "mixtral": MixtralConfig(**_COMMON, num_local_experts=4, num_experts_per_tok=2),
        "qwen2_moe": Qwen2MoeConfig(**_COMMON, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
                                    shared_expert_intermediate_size=96, mlp_only_layers=[1]),
        "qwen3_moe": Qwen3MoeConfig(**_COMMON, head_dim=32, num_experts=8, num_experts_per_tok=3,
                                    moe_intermediate_size=32, norm_topk_prob=True),
        "deepseek_v2": DeepseekV2Config(**_MLA, q_lora_rank=None, n_routed_experts=8, num_experts_per_tok=3,
                                        n_shared_experts=1, topk_method="group_limited_greedy", n_group=4,
                                        topk_group=2, routed_scaling_factor=1.5, rope_parameters={
                                            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                            "original_max_position_embeddings": 64, "beta_fast": 32,
                                            "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.8}),
        "deepseek_v3": DeepseekV3Config(**_MLA, q_lora_rank=48, n_routed_experts=8, num_experts_per_tok=3,
                                        n_shared_experts=1, n_group=4, topk_group=2, norm_topk_prob=True,
                                        routed_scaling_factor=2.5),
    }


def hf_model(config: PretrainedConfig) -> torch.nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32).eval()


PROMPT_LENS = [1, 7, 13, 24]


def build_pair(config: PretrainedConfig) -> tuple[torch.nn.Module, torch.nn.Module]:
    """An HF model with every weight random (norms and biases too) and ours loaded from its state_dict."""
    hf = hf_model(config)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if "norm" in name:
                param.normal_(1.0, 0.2)
            elif name.endswith("bias"):
                param.normal_(0.0, 0.2)
    ours = get_model_class([type(hf).__name__])(config).eval()
    loaded = ours.load_weights(hf.state_dict().items())
    assert loaded == {name for name, _ in ours.named_parameters()}
    return hf, ours


def word_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A tokenizer of vocab_size made-up words ("w0" ...), for tests that feed token ids: no model file needed
    (the default model's 94 MB GGUF is more than a GPU run can carry)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=words, unk_token="w0", eos_token="w2")


def prompts(vocab_size: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, vocab_size, (n,), generator=g).tolist() for n in PROMPT_LENS]
