"""Our torch dequantization against the gguf package's numpy reference, bit for bit."""

from __future__ import annotations

from collections import defaultdict

import gguf
import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from wick.loader.gguf_dequant import SUPPORTED_TYPES, dequantize
from wick.loader.gguf_loader import open_gguf

# Byte offsets of the float16 scale fields in the block formats gguf cannot quantize to; random
# bytes there could be inf or NaN, so the tests write finite values.
_F16_FIELDS = {
    GGMLQuantizationType.Q2_K: (80, 82),
    GGMLQuantizationType.Q3_K: (108,),
    GGMLQuantizationType.Q4_K: (0, 2),
    GGMLQuantizationType.Q5_K: (0, 2),
    GGMLQuantizationType.Q6_K: (208,),
    GGMLQuantizationType.IQ4_NL: (0,),
    GGMLQuantizationType.IQ4_XS: (0,),
}


def _reference(raw: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(gguf.quants.dequantize(raw, qtype))).reshape(shape)


def _synthetic(qtype: GGMLQuantizationType, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if qtype not in _F16_FIELDS:
        return gguf.quants.quantize(rng.standard_normal(shape).astype(np.float32), qtype)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(int(np.prod(shape)) // block_size, type_size), dtype=np.uint8)
    for offset in _F16_FIELDS[qtype]:
        scales = rng.uniform(-0.1, 0.1, size=blocks.shape[0]).astype(np.float16)
        blocks[:, offset : offset + 2] = scales.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(shape[0], -1)


@pytest.mark.parametrize("qtype", sorted(SUPPORTED_TYPES), ids=lambda t: t.name)
def test_synthetic_blocks_match_reference(qtype: GGMLQuantizationType) -> None:
    shape = (6, 512)
    raw = _synthetic(qtype, shape)
    ours = dequantize(raw, qtype, shape)
    assert ours.dtype == torch.float32 and ours.shape == shape
    assert torch.equal(ours, _reference(raw, qtype, shape))


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q8_0], ids=lambda t: t.name)
def test_torch_input_and_3d_shape(qtype: GGMLQuantizationType) -> None:
    shape = (2, 3, 256)
    raw = _synthetic(qtype, (6, 256), seed=1)
    ours = dequantize(torch.from_numpy(raw), qtype, shape)
    assert torch.equal(ours, _reference(raw, qtype, shape))


def test_float_input_is_copied() -> None:
    raw = np.arange(8, dtype=np.float32)
    out = dequantize(raw, GGMLQuantizationType.F32, (2, 4))
    out += 1
    assert raw[0] == 0


def test_wrong_size_and_unsupported_type_raise() -> None:
    raw = _synthetic(GGMLQuantizationType.Q4_0, (1, 64))
    with pytest.raises(ValueError):
        dequantize(raw, GGMLQuantizationType.Q4_0, (1, 96))
    with pytest.raises(NotImplementedError):
        dequantize(raw, GGMLQuantizationType.IQ2_XXS, (1, 256))


def _smallest_per_type(path: str, per_type: int = 2) -> list[gguf.ReaderTensor]:
    by_type: dict[GGMLQuantizationType, list[gguf.ReaderTensor]] = defaultdict(list)
    for tensor in open_gguf(path).tensors:
        by_type[tensor.tensor_type].append(tensor)
    return [t for tensors in by_type.values() for t in sorted(tensors, key=lambda t: t.n_elements)[:per_type]]


@pytest.mark.parametrize("model", ["smollm2_gguf", "qwen_gguf"])
def test_real_tensors_match_reference(model: str, request: pytest.FixtureRequest) -> None:
    tensors = _smallest_per_type(request.getfixturevalue(model))
    expected_types = {
        "smollm2_gguf": {"Q4_1", "Q8_0", "F32"},
        "qwen_gguf": {"Q5_0", "Q8_0", "Q6_K", "Q4_K", "F32"},
    }[model]
    assert {t.tensor_type.name for t in tensors} == expected_types
    for tensor in tensors:
        shape = tuple(int(d) for d in reversed(tensor.shape))
        ours = dequantize(tensor.data, tensor.tensor_type, shape)
        assert torch.equal(ours, _reference(tensor.data, tensor.tensor_type, shape)), tensor.name
