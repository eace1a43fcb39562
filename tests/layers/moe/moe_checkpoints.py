"""Test helper: a small random Qwen3-MoE from transformers, its state as checkpoints on the hub hold experts (one
tensor each), the HF model over weights a quantized checkpoint dequantizes to, and ours built from a checkpoint."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoConfig, AutoModelForCausalLM

from wick.layers.moe.fused_moe import FusedMoE
from wick.layers.quantization.base import QuantizationConfig, quantization_scope
from wick.loader.weights import process_weights_after_loading
from wick.models.registry import get_model_class

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models"))
from paged_generate import PagedRunner, Sequence  # noqa: E402

# hidden 320: a partial 128-wide scale tile or group at the end of every row of w13 and of every column of w2
SIZES = dict(vocab_size=96, hidden_size=320, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=128, max_position_embeddings=512, num_experts=4, num_experts_per_tok=2,
             moe_intermediate_size=256, norm_topk_prob=True, tie_word_embeddings=False)
ATTENTION = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight")


def hf_model(**sizes: int) -> torch.nn.Module:
    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen3_moe", **{**SIZES, **sizes})
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def per_expert(state: dict[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """transformers 5's stacked experts as checkpoints on the hub hold them: experts.{e}.{gate,up,down}_proj.weight."""
    for name, tensor in state.items():
        prefix, _, stacked = name.rpartition("experts.")
        if stacked == "gate_up_proj":
            inter = tensor.shape[1] // 2
            for e, matrix in enumerate(tensor):
                yield f"{prefix}experts.{e}.gate_proj.weight", matrix[:inter]
                yield f"{prefix}experts.{e}.up_proj.weight", matrix[inter:]
        elif stacked == "down_proj":
            for e, matrix in enumerate(tensor):
                yield f"{prefix}experts.{e}.down_proj.weight", matrix
        else:
            yield name, tensor


def reference(hf: torch.nn.Module, dequantized: dict[str, torch.Tensor]) -> torch.nn.Module:
    """`hf` over the weights named in `dequantized` (per_expert's names for experts), the others its own."""
    state = {}
    for name, tensor in hf.state_dict().items():
        prefix, _, stacked = name.rpartition("experts.")
        experts = range(tensor.shape[0]) if stacked in ("gate_up_proj", "down_proj") else ()
        if stacked == "gate_up_proj":
            tensor = torch.stack([torch.cat([dequantized[f"{prefix}experts.{e}.gate_proj.weight"],
                                             dequantized[f"{prefix}experts.{e}.up_proj.weight"]]) for e in experts])
        elif stacked == "down_proj":
            tensor = torch.stack([dequantized[f"{prefix}experts.{e}.down_proj.weight"] for e in experts])
        state[name] = dequantized.get(name, tensor)
    model = type(hf)(hf.config).eval()
    model.load_state_dict(state)
    return model


def build_ours(hf_config, config: QuantizationConfig, checkpoint) -> torch.nn.Module:
    with quantization_scope(config):
        ours = get_model_class(hf_config.architectures or ["Qwen3MoeForCausalLM"])(hf_config).eval()
    with torch.no_grad():
        ours.load_weights(checkpoint)
    process_weights_after_loading(ours)
    return ours


def first_logits(model: torch.nn.Module, prompt: list[int]) -> torch.Tensor:
    """The logits of every prompt position from one step of the paged engine's runner."""
    (logits,) = PagedRunner(model).step([(Sequence(prompt), len(prompt))])
    return logits


def assert_same_logits(ours: torch.nn.Module, reference_model: torch.nn.Module) -> None:
    prompt = [5, 17, 3, 60, 2, 41, 9, 9, 30]
    with torch.no_grad():
        expected = reference_model(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(first_logits(ours, prompt), expected, atol=1e-4, rtol=1e-4)


TP_PROMPT = [5, 17, 3, 60, 2]


def _rank_main(rank: int, port: int, hf_config, config: QuantizationConfig, checkpoint: list, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.set_num_threads(1)
        logits = first_logits(build_ours(hf_config, config, checkpoint), TP_PROMPT)
        if rank == 0:
            torch.save(logits, out)
    finally:
        dist.destroy_process_group()


def logits_on_two_ranks(hf_config, config: QuantizationConfig, checkpoint: list, tmp_path: Path) -> torch.Tensor:
    """first_logits of TP_PROMPT from ours built on two gloo ranks of one tensor-parallel group."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "rank0.pt"
    mp.spawn(_rank_main, args=(port, hf_config, config, checkpoint, str(out)), nprocs=2)
    return torch.load(out)


def assert_dummy_experts_run_as_dequantized(layer: FusedMoE, experts: dict) -> None:
    """Random experts of a quantized layer (`experts`: its w13 and w2, which dequantize_all): every expert filled
    within the dummy loader's [-1e-3, 1e-3], and the layer runs on them as a float layer over their values."""
    for quantized in experts.values():
        values = quantized.dequantize_all()
        assert values.abs().amax(dim=(1, 2)).min() > 5e-4 and values.abs().max() <= 1e-3 + 1e-6
    hidden, num_experts = layer.hidden_size, layer.spec.num_experts
    x = torch.randn(4, hidden)
    logits = torch.randn(4, num_experts)
    dense = FusedMoE(layer.spec, hidden)
    dense.w13_weight.data = experts["w13"].dequantize_all()
    dense.w2_weight.data = experts["w2"].dequantize_all()
    torch.testing.assert_close(layer(x, logits), dense(x, logits))
