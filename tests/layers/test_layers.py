"""Linear layers' shard-aware loaders, norm, activation and vocabulary layers at TP size 1."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from wick.layers.activation import GeluAndMul, SiluAndMul
from wick.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from wick.layers.norm import RMSNorm
from wick.layers.vocab_embedding import ParallelLMHead, VocabParallelEmbedding


def load(param: torch.nn.Parameter, tensor: torch.Tensor, shard_id: str | int | None = None) -> None:
    param.weight_loader(param, tensor, shard_id)


def test_qkv_merges_projections() -> None:
    torch.manual_seed(0)
    layer = QKVParallelLinear(32, head_size=8, total_num_heads=4, total_num_kv_heads=2, bias=True)
    parts = {"q": torch.nn.Linear(32, 32), "k": torch.nn.Linear(32, 16), "v": torch.nn.Linear(32, 16)}
    for shard, linear in parts.items():
        load(layer.weight, linear.weight, shard)
        load(layer.bias, linear.bias, shard)
    x = torch.randn(5, 32)
    torch.testing.assert_close(layer(x), torch.cat([linear(x) for linear in parts.values()], dim=-1))


def test_merged_column_and_row() -> None:
    torch.manual_seed(0)
    gate_up = MergedColumnParallelLinear(16, [24, 24])
    gate, up = torch.randn(24, 16), torch.randn(24, 16)
    load(gate_up.weight, gate, 0)
    load(gate_up.weight, up, 1)
    down = RowParallelLinear(24, 16, bias=True)
    down_w, down_b = torch.randn(16, 24), torch.randn(16)
    load(down.weight, down_w)
    load(down.bias, down_b)
    x = torch.randn(3, 16)
    expected = F.linear(F.silu(x @ gate.T) * (x @ up.T), down_w, down_b)
    torch.testing.assert_close(down(SiluAndMul()(gate_up(x))), expected)


@pytest.mark.parametrize("act_fn", [SiluAndMul(), GeluAndMul("tanh")], ids=["silu", "gelu_tanh"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])])
def test_merged_column_gated(device: str, act_fn: torch.nn.Module) -> None:
    """gate_up.gated(x, act_fn) is act_fn(gate_up(x)): on a GPU at one bf16 row, the gated GEMV in one kernel."""
    torch.manual_seed(0)
    gate_up = MergedColumnParallelLinear(256, [96, 96], bias=True).to(device, torch.bfloat16)
    load(gate_up.weight, torch.randn(96, 256), 0)
    load(gate_up.weight, torch.randn(96, 256), 1)
    load(gate_up.bias, torch.randn(96), 0)
    load(gate_up.bias, torch.randn(96), 1)
    x = torch.randn(1, 256, device=device, dtype=torch.bfloat16)
    expected = act_fn(gate_up(x))
    torch.testing.assert_close(gate_up.gated(x, act_fn), expected, atol=0.02 * expected.abs().max().item(), rtol=0)


def test_column_parallel() -> None:
    layer = ColumnParallelLinear(8, 4)
    w = torch.randn(4, 8)
    load(layer.weight, w)
    x = torch.randn(2, 8)
    torch.testing.assert_close(layer(x), x @ w.T)


def test_rmsnorm_matches_hf_with_and_without_residual() -> None:
    torch.manual_seed(0)
    hf = LlamaRMSNorm(32, eps=1e-6)
    hf.weight.data.normal_(1.0, 0.3)
    ours = RMSNorm(32, eps=1e-6)
    load(ours.weight, hf.weight.data)
    x, residual = torch.randn(4, 32), torch.randn(4, 32)
    torch.testing.assert_close(ours(x), hf(x))
    out, new_residual = ours(x, residual)
    torch.testing.assert_close(new_residual, x + residual)
    torch.testing.assert_close(out, hf(x + residual))


def test_embedding_and_lm_head() -> None:
    embed, head = VocabParallelEmbedding(10, 4), ParallelLMHead(10, 4)
    table = torch.randn(10, 4)
    load(embed.weight, table)
    load(head.weight, table)
    ids = torch.tensor([0, 9, 3])
    torch.testing.assert_close(embed(ids), table[ids])
    torch.testing.assert_close(head(table[ids]), table[ids] @ table.T)
    with pytest.raises(ValueError, match="vocab size mismatch"):
        load(embed.weight, torch.randn(11, 4))


def test_replicated_loader_checks_shape() -> None:
    with pytest.raises(ValueError, match="shape mismatch"):
        load(RMSNorm(8).weight, torch.ones(9))
