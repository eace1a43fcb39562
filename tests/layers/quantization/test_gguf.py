"""GGUF linear layers keep their blocks packed and compute x W^T of the gguf package's dequantization."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType
from gguf_blocks import packed_qkv, random_gguf, reference

from wick.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from wick.layers.quantization.base import quantization_scope
from wick.layers.quantization.gguf import GGUFConfig, GGUFWeight, gguf_embedding
from wick.layers.vocab_embedding import ParallelLMHead, VocabParallelEmbedding
from wick.loader.gguf_dequant import SUPPORTED_TYPES

T = GGMLQuantizationType


@pytest.mark.parametrize("qtype", sorted(SUPPORTED_TYPES), ids=lambda t: t.name)
def test_merged_layer_of_one_type(qtype: GGMLQuantizationType) -> None:
    with quantization_scope(GGUFConfig()):
        layer = MergedColumnParallelLinear(512, [8, 16])
    gate, up = random_gguf(qtype, 8, 512, seed=1), random_gguf(qtype, 16, 512, seed=2)
    layer.weight.weight_loader(layer.weight, gate, 0)
    layer.weight.weight_loader(layer.weight, up, 1)
    layer.quant_method.process_weights_after_loading(layer)
    x = torch.randn(3, 512)
    expected = x @ torch.cat([reference(gate), reference(up)]).t()
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)


def test_qkv_of_mixed_types_with_bias_keeps_shards_packed() -> None:
    shards = {"q": random_gguf(T.Q4_K, 64, 256, 1), "k": random_gguf(T.Q4_K, 32, 256, 2),
              "v": random_gguf(T.Q6_K, 32, 256, 3)}
    bias = torch.randn(128)
    layer = packed_qkv(shards, bias)
    assert [p.qtype for p in layer.gguf_parts] == [T.Q4_K, T.Q4_K, T.Q6_K]  # CPU: views, not joined
    assert all(p.data.dtype == torch.uint8 for p in layer.gguf_parts)
    x = torch.randn(5, 256)
    expected = x @ torch.cat([reference(w) for w in shards.values()]).t() + bias
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)


def test_row_parallel_rank_takes_whole_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    weight = random_gguf(T.Q4_K, 16, 512, 4)
    layer = _row_parallel_rank(monkeypatch, 512)
    layer.weight.weight_loader(layer.weight, weight)
    layer.quant_method.process_weights_after_loading(layer)
    x = torch.randn(2, 256)
    torch.testing.assert_close(layer.quant_method.apply(layer, x, None), x @ reference(weight)[:, 256:].t())
    with pytest.raises(ValueError, match="multiples of 256"):
        odd = _row_parallel_rank(monkeypatch, 256)  # 128 columns a rank: half a Q4_K block
        odd.weight.weight_loader(odd.weight, random_gguf(T.Q4_K, 16, 256, 4))


def _row_parallel_rank(monkeypatch: pytest.MonkeyPatch, input_size: int) -> RowParallelLinear:
    """Rank 1 of 2 of a row-parallel layer (the TP group faked)."""
    import wick.layers.linear as linear

    monkeypatch.setattr(linear, "tp_rank", lambda: 1)
    monkeypatch.setattr(linear, "tp_world_size", lambda: 2)
    with quantization_scope(GGUFConfig()):
        return RowParallelLinear(input_size, 16)


def test_chunked_dequantization_matches_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    import wick.layers.quantization.gguf as gguf_method

    weight = random_gguf(T.Q8_0, 40, 64, 5)
    x = torch.randn(3, 64)
    monkeypatch.setattr(gguf_method, "_DEQUANT_CHUNK_BYTES", 64 * 4 * 7)  # 7 rows at a time
    torch.testing.assert_close(gguf_method.gguf_linear(x, weight), x @ reference(weight).t())


def test_packed_embedding_and_tied_head() -> None:
    with quantization_scope(GGUFConfig()):
        embed = VocabParallelEmbedding(10, 64)
        head = ParallelLMHead(10, 64)
    head.weight = embed.weight
    table = random_gguf(T.Q5_0, 10, 64, 6)
    embed.weight.weight_loader(embed.weight, table)
    assert embed.weight.dtype == torch.uint8 and embed.weight.shape == table.data.shape
    ids = torch.tensor([[3, 0], [9, 3]])
    torch.testing.assert_close(embed(ids), reference(table)[ids])
    hidden = torch.randn(4, 64)
    torch.testing.assert_close(head(hidden), hidden @ reference(table).t())


def test_padded_embedding_rows_are_zero() -> None:
    table = random_gguf(T.Q4_0, 3, 32, 7)
    padded = GGUFWeight(torch.cat([table.data, torch.zeros_like(table.data[:1])]), table.qtype, (4, 32))
    out = gguf_embedding(torch.tensor([3, 1]), padded, torch.float32)
    assert torch.equal(out[0], torch.zeros(32))
    torch.testing.assert_close(out[1], reference(table)[1])


def test_plain_tensor_is_refused() -> None:
    with quantization_scope(GGUFConfig()):
        layer = RowParallelLinear(32, 8)
    with pytest.raises(TypeError, match="packed GGUF"):
        layer.weight.weight_loader(layer.weight, torch.zeros(8, 32))
