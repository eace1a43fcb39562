"""GGUF files with experts (llama.cpp's layout: each layer's experts stacked in ffn_{gate,up,down}_exps,
the router in ffn_gate_inp, Qwen2-MoE's shared expert in *_shexp) load into the same model as the
HF checkpoint they were written from: qwen3moe, qwen2moe, and llama with experts (Mixtral); as the engine
loads them (matrices packed), the routers are the same floats; Q4_K experts stay packed."""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from wick.layers.moe.fused_moe import FusedMoE
from wick.layers.quantization.base import quantization_scope
from wick.layers.quantization.gguf import GGUFConfig
from wick.layers.quantization.gguf_quantize import quantize
from wick.loader.gguf_loader import iter_gguf_weights, load_gguf_config
from wick.loader.presets import config_from_dict
from wick.loader.weights import process_weights_after_loading
from wick.models.registry import get_model_class

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from paged_generate import PagedRunner  # noqa: E402

_LAYER = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate": "ffn_gate_inp", "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
    "mlp.shared_expert.up_proj": "ffn_up_shexp", "mlp.shared_expert.down_proj": "ffn_down_shexp",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
}
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}


def _llama_rows(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """llama.cpp's interleaved rotary row order of Q and K (llama architecture only)."""
    return w.reshape(num_heads, 2, w.shape[0] // num_heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _gguf_tensors(model: PreTrainedModel, arch: str) -> dict[str, torch.Tensor]:
    cfg = model.config
    out = {}
    for name, tensor in model.state_dict().items():
        if name in _TOP:
            out[_TOP[name]] = tensor
            continue
        _, _, layer, rest = name.split(".", 3)
        if rest == "mlp.experts.gate_up_proj":  # transformers 5 holds [E, 2I, H]: gate rows, then up rows
            gate, up = tensor.chunk(2, dim=1)
            out[f"blk.{layer}.ffn_gate_exps.weight"], out[f"blk.{layer}.ffn_up_exps.weight"] = gate, up
            continue
        if rest == "mlp.experts.down_proj":
            out[f"blk.{layer}.ffn_down_exps.weight"] = tensor
            continue
        module, kind = rest.rsplit(".", 1)
        if arch == "llama" and module in ("self_attn.q_proj", "self_attn.k_proj"):
            heads = cfg.num_attention_heads if module.endswith("q_proj") else cfg.num_key_value_heads
            tensor = _llama_rows(tensor, heads)
        if module == "mlp.shared_expert_gate":
            tensor = tensor.reshape(-1)
        out[f"blk.{layer}.{_LAYER[module]}.{kind}"] = tensor
    return out


def _write(path: Path, model: PreTrainedModel, arch: str, experts: gguf.GGMLQuantizationType | None = None) -> None:
    """The model as a GGUF file, every tensor in float32 but the experts' in `experts` (our quantizer) if given."""
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_key_length(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_expert_count(cfg.num_local_experts if arch == "llama" else cfg.num_experts)
    writer.add_expert_used_count(cfg.num_experts_per_tok)
    if arch != "llama":
        writer.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    if arch == "qwen2moe":
        writer.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    for name, tensor in _gguf_tensors(model, arch).items():
        if experts is not None and "_exps." in name:
            blocks = quantize(tensor.reshape(-1, tensor.shape[-1]), experts).reshape(*tensor.shape[:-1], -1)
            writer.add_tensor(name, blocks.numpy(), raw_dtype=experts)
            continue
        writer.add_tensor(name, tensor.contiguous().numpy().astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


_SIZES = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, num_experts_per_tok=2, tie_word_embeddings=False)
CASES = {
    "qwen3moe": ("qwen3_moe", dict(head_dim=32, num_experts=6, moe_intermediate_size=32, norm_topk_prob=True)),
    "qwen2moe": ("qwen2_moe", dict(num_experts=6, moe_intermediate_size=32, shared_expert_intermediate_size=80,
                                   norm_topk_prob=False)),
    "llama": ("mixtral", dict(num_local_experts=4)),
}


@pytest.mark.parametrize("arch", CASES)
def test_experts_load_as_from_the_hf_checkpoint(arch: str, tmp_path: Path) -> None:
    model_type, options = CASES[arch]
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **_SIZES, **options),
                                          dtype=torch.float32)
    path = tmp_path / f"tiny-{arch}.gguf"
    _write(path, hf, arch)

    config = config_from_dict(load_gguf_config(path))
    assert config.model_type == model_type
    for key in ("num_experts_per_tok", "hidden_size", "num_key_value_heads", *options):
        assert getattr(config, key) == getattr(hf.config, key), key
    from_gguf = get_model_class(config.architectures)(config)
    loaded = from_gguf.load_weights(iter_gguf_weights(str(path)))
    assert loaded == {name for name, _ in from_gguf.named_parameters()}
    from_hf = get_model_class([type(hf).__name__])(hf.config)
    from_hf.load_weights(hf.state_dict().items())
    theirs = dict(from_hf.named_parameters())
    for name, param in from_gguf.named_parameters():
        assert torch.equal(param, theirs[name]), name

    with quantization_scope(GGUFConfig()):
        packed = get_model_class(config.architectures)(config)
    assert packed.load_weights(iter_gguf_weights(str(path), packed=True)) == loaded
    process_weights_after_loading(packed)
    routers = [name for name, _ in packed.named_parameters()
               if name.endswith(("mlp.gate.weight", "expert_gate.weight"))]
    assert routers
    dense = dict(from_gguf.named_parameters())
    for name in routers:
        assert torch.equal(dict(packed.named_parameters())[name], dense[name]), name
    # float32 experts load as floats, as the checkpoint's
    for name, param in packed.named_parameters():
        if ".experts." in name:
            assert torch.equal(param, dense[name]), name


@pytest.mark.parametrize("qtype", [gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q5_K,
                                   gguf.GGMLQuantizationType.Q3_K], ids=lambda t: t.name)
def test_quantized_experts_stay_packed_and_decode_as_their_floats(tmp_path: Path,
                                                                  qtype: gguf.GGMLQuantizationType) -> None:
    """A qwen3moe file with quantized experts: loaded packed, the experts keep their blocks, and the model decodes
    through the paged KV cache as the same file's experts decoded to floats at load do."""
    torch.manual_seed(0)
    sizes = dict(_SIZES, hidden_size=256, head_dim=64, num_experts=4, moe_intermediate_size=256,
                 norm_topk_prob=True)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen3_moe", **sizes), dtype=torch.float32)
    path = tmp_path / f"tiny-qwen3moe-{qtype.name}.gguf"
    _write(path, hf, "qwen3moe", experts=qtype)
    config = config_from_dict(load_gguf_config(path))
    floats = get_model_class(config.architectures)(config)
    floats.load_weights(iter_gguf_weights(str(path)))
    with quantization_scope(GGUFConfig()):
        packed = get_model_class(config.architectures)(config)
    packed.load_weights(iter_gguf_weights(str(path), packed=True))
    process_weights_after_loading(packed)
    layers = [m for m in packed.modules() if isinstance(m, FusedMoE)]
    assert layers and all(set(m.packed) == {"w13", "w2"} and m.w13_weight.dtype == torch.uint8
                          and m.packed["w13"].qtype == qtype for m in layers)
    prompts = [[5, 17, 3, 60, 2], [9, 9, 41]]
    for (tokens, logits), (expected_tokens, expected) in zip(PagedRunner(packed).generate(prompts, 8),
                                                             PagedRunner(floats).generate(prompts, 8), strict=True):
        assert tokens == expected_tokens
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
