"""The CPU kernels of GGUF weights (gguf_cpu.py): x W^T of the gguf package's dequantization, up to the
bfloat16 rounding of the inputs, scales and outputs; and on the default model, the float32 path's argmax."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType
from gguf_blocks import packed_qkv, random_gguf, reference
from test_gguf_models import TEXT, _model, _teacher_forced_logits
from transformers import PreTrainedTokenizerBase

from wick.layers.linear import MergedColumnParallelLinear
from wick.layers.quantization.base import quantization_scope
from wick.layers.quantization.gguf import GGUFConfig, gguf_linear
from wick.layers.quantization.gguf_cpu import CPU_KERNEL_TYPES, Int4Weight, Int8Weight

T = GGMLQuantizationType


@pytest.fixture(autouse=True)
def cpu_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WICK_CPU_QUANT_KERNELS", raising=False)


@pytest.mark.parametrize("qtype", sorted(CPU_KERNEL_TYPES), ids=lambda t: t.name)
@pytest.mark.parametrize("shape", [(1, 512), (12, 512), (33, 512), (2, 3, 512)], ids=str)
def test_kernel_computes_the_dequantized_product(qtype: GGMLQuantizationType, shape: tuple[int, ...]) -> None:
    weight = random_gguf(qtype, 4160, 512, seed=3)  # more rows than one conversion chunk
    kernel = weight.with_cpu_kernel()
    assert isinstance(kernel.cpu_kernel, Int8Weight if qtype in (T.Q6_K, T.IQ4_NL, T.IQ4_XS) else Int4Weight)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    expected = x.bfloat16().float() @ reference(weight).t()
    got = gguf_linear(x, kernel)
    assert got.shape == expected.shape and got.dtype == torch.float32
    scale = expected.abs().amax(dim=-1, keepdim=True)
    torch.testing.assert_close(got / scale, expected / scale, rtol=0, atol=2e-2)
    assert (got - expected).abs().mean() < 2e-3 * scale.mean()


@pytest.mark.parametrize("qtype", [T.Q8_0, T.IQ4_NL, T.IQ4_XS, T.Q6_K], ids=lambda t: t.name)
def test_int8_weights_multiply_a_prompt_by_their_rows_in_float32(qtype: GGMLQuantizationType) -> None:
    """Q8_0 takes this path where the int4 kernel cannot: rows not in tiles of 16, or shards with IQ4's."""
    weight = random_gguf(qtype, 96, 512, seed=5)
    kernel = Int8Weight([weight.piece()])
    # the file's weights but for the scales, which the kernel holds in bfloat16 (8 significant bits)
    torch.testing.assert_close(kernel.dequantized(0, 96), reference(weight), rtol=2**-8, atol=0)
    torch.testing.assert_close(kernel.dequantized(40, 24), reference(weight)[40:64], rtol=2**-8, atol=0)
    prompt = torch.randn(kernel.kernel_rows, 512)
    assert torch.equal(kernel(prompt), prompt @ kernel.dequantized(0, 96).t())
    step = prompt[:kernel.kernel_rows - 1]  # fewer rows: the int8 kernel, x rounded to bfloat16
    _assert_bf16_close(kernel(step), step.bfloat16().float() @ kernel.dequantized(0, 96).t())
    assert not torch.equal(kernel(step), step @ kernel.dequantized(0, 96).t())


def test_a_q8_0_lm_head_keeps_the_int8_kernel() -> None:
    """The int4 kernel's two planes round their sums to bfloat16; a head's logits are summed in float32."""
    weight = random_gguf(T.Q8_0, 128, 256)
    assert len(weight.with_cpu_kernel().cpu_kernel.packed) == 2
    assert isinstance(weight.with_cpu_kernel(logits=True).cpu_kernel, Int8Weight)


def _assert_bf16_close(got: torch.Tensor, expected: torch.Tensor) -> None:
    scale = expected.abs().amax(dim=-1, keepdim=True)
    torch.testing.assert_close(got / scale, expected / scale, rtol=0, atol=2e-2)


def test_qkv_shards_of_4_bit_types_run_as_one_kernel() -> None:
    shards = {"q": random_gguf(T.Q4_K, 128, 256, 1), "k": random_gguf(T.Q4_0, 64, 256, 2),
              "v": random_gguf(T.Q4_1, 64, 256, 3)}
    bias = torch.randn(256)
    layer = packed_qkv(shards, bias)
    assert isinstance(layer.cpu_kernel, Int4Weight)
    x = torch.randn(5, 256)
    _assert_bf16_close(layer(x), x.bfloat16().float() @ torch.cat([reference(w) for w in shards.values()]).t() + bias)


# The gate's 48 rows are no whole tile of 64, so Q8_0 shards stack on the int8 kernel, not the int4 one.
@pytest.mark.parametrize(("types", "joint"), [((T.Q8_0, T.Q8_0), Int8Weight), ((T.Q6_K, T.Q6_K), Int8Weight),
                                              ((T.IQ4_XS, T.Q8_0), Int8Weight), ((T.IQ4_NL, T.Q6_K), None),
                                              ((T.Q4_K, T.Q6_K), None)],
                         ids=["q8_0", "q6_k", "iq4_xs+q8_0", "iq4_nl+q6_k", "q4_k+q6_k"])
def test_gate_up_shards(types: tuple[GGMLQuantizationType, ...], joint: type | None) -> None:
    with quantization_scope(GGUFConfig()):
        layer = MergedColumnParallelLinear(256, [48, 64])
    gate, up = random_gguf(types[0], 48, 256, seed=1), random_gguf(types[1], 64, 256, seed=2)
    layer.weight.weight_loader(layer.weight, gate, 0)
    layer.weight.weight_loader(layer.weight, up, 1)
    layer.quant_method.process_weights_after_loading(layer)
    if joint is None:  # each shard its own: a Q4_K one by the int4 kernel, runs of 32 apart from Q6_K's of 16
        assert layer.cpu_kernel is None
        assert [type(part.cpu_kernel) for part in layer.gguf_parts] == [
            Int8Weight if types[0] == T.IQ4_NL else Int4Weight, Int8Weight]
    else:
        assert isinstance(layer.cpu_kernel, joint)
    x = torch.randn(3, 256)
    _assert_bf16_close(layer(x), x.bfloat16().float() @ torch.cat([reference(gate), reference(up)]).t())


def test_4_and_5_bit_shards_run_as_one_kernel_of_two_planes() -> None:
    """q in Q4_K, k and v in Q5_0 and Q5_1: the 4-bit rows' fifth-bit plane is zeros."""
    shards = {"q": random_gguf(T.Q4_K, 128, 256, 1), "k": random_gguf(T.Q5_0, 64, 256, 2),
              "v": random_gguf(T.Q5_1, 64, 256, 3)}
    layer = packed_qkv(shards, torch.zeros(256))
    assert isinstance(layer.cpu_kernel, Int4Weight) and len(layer.cpu_kernel.packed) == 2
    assert len(random_gguf(T.Q4_K, 64, 256).with_cpu_kernel().cpu_kernel.packed) == 1
    x = torch.randn(5, 256)
    _assert_bf16_close(layer(x), x.bfloat16().float() @ torch.cat([reference(w) for w in shards.values()]).t())


def test_types_and_shapes_without_a_kernel_keep_the_float32_path(monkeypatch: pytest.MonkeyPatch) -> None:
    assert random_gguf(T.Q3_K, 64, 256).with_cpu_kernel().cpu_kernel is None
    assert random_gguf(T.Q4_K, 40, 256).with_cpu_kernel().cpu_kernel is None  # int4 tiles are 16 rows
    monkeypatch.setenv("WICK_CPU_QUANT_KERNELS", "0")
    assert random_gguf(T.Q4_1, 64, 256).with_cpu_kernel().cpu_kernel is None


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2_gguf", "qwen_gguf"])
def test_models_follow_the_float32_path(name: str, request: pytest.FixtureRequest,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The default model (Q4_1 in the int4 kernel) and Qwen2.5-Coder-0.5B (mostly Q5_0, in two planes of it):
    bfloat16 may only swap near-ties: the argmax agrees at nearly every position of real text, and where it
    does not, the float32 path's two best logits are within 0.1 and the kernels chose the other of them."""
    path = request.getfixturevalue(name)
    tokenizer: PreTrainedTokenizerBase = request.getfixturevalue(name.replace("_gguf", "_tokenizer"))
    ids = tokenizer(TEXT)["input_ids"]
    fast = _model(path, packed=True)
    assert isinstance(fast.model.layers[0].mlp.gate_up_proj.cpu_kernel, Int4Weight)
    assert isinstance(fast.lm_head.weight.gguf.cpu_kernel, Int8Weight)  # a Q8_0 head: see cpu_kernel_weight
    got = _teacher_forced_logits(fast, ids)
    monkeypatch.setenv("WICK_CPU_QUANT_KERNELS", "0")
    expected = _teacher_forced_logits(_model(path, packed=True), ids)
    agree = got.argmax(-1) == expected.argmax(-1)
    assert agree.float().mean() >= 0.95
    best = expected.topk(2, dim=-1)
    for position in (~agree).nonzero().flatten().tolist():
        assert best.values[position, 0] - best.values[position, 1] < 0.1
        assert got[position].argmax() == best.indices[position, 1]
