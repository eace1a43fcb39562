"""Test helper: random GGUF tensors of any supported type, as packed bytes and as the gguf package
dequantizes them (the oracle)."""

from __future__ import annotations

import gguf
import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from wick.layers.linear import QKVParallelLinear
from wick.layers.quantization.base import quantization_scope
from wick.layers.quantization.gguf import GGUFConfig, GGUFWeight

# Byte offsets of the float16 fields of the formats gguf cannot quantize to: random bytes there
# could be inf or NaN, so these get finite values.
_F16_FIELDS = {
    GGMLQuantizationType.Q2_K: (80, 82),
    GGMLQuantizationType.Q3_K: (108,),
    GGMLQuantizationType.Q4_K: (0, 2),
    GGMLQuantizationType.Q5_K: (0, 2),
    GGMLQuantizationType.Q6_K: (208,),
    GGMLQuantizationType.IQ4_NL: (0,),
    GGMLQuantizationType.IQ4_XS: (0,),
}
_FLOATS = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16}


def random_gguf(qtype: GGMLQuantizationType, rows: int, columns: int, seed: int = 0) -> GGUFWeight:
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((rows, columns)).astype(np.float32) * 0.1
    if qtype in _FLOATS:
        raw = values.astype(_FLOATS[qtype]).view(np.uint8)
    elif qtype == GGMLQuantizationType.BF16 or qtype not in _F16_FIELDS:
        raw = gguf.quants.quantize(values, qtype)
    else:
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, size=(rows * columns // block_size, type_size), dtype=np.uint8)
        for offset in _F16_FIELDS[qtype]:
            scales = rng.uniform(-0.01, 0.01, size=raw.shape[0]).astype(np.float16)
            raw[:, offset:offset + 2] = scales.view(np.uint8).reshape(-1, 2)
    data = torch.from_numpy(np.ascontiguousarray(raw).reshape(rows, -1))
    return GGUFWeight(data, qtype, (rows, columns))


def reference(weight: GGUFWeight) -> torch.Tensor:
    """The gguf package's float32 dequantization of `weight`."""
    raw = weight.data.numpy()
    return torch.from_numpy(np.ascontiguousarray(gguf.quants.dequantize(raw, weight.qtype))).reshape(weight.shape)


def packed_qkv(shards: dict[str, GGUFWeight], bias: torch.Tensor) -> QKVParallelLinear:
    """A GGUF QKV layer of one KV head loaded from its q, k and v shards and bias, ready to run."""
    head_dim, hidden = shards["k"].shape
    with quantization_scope(GGUFConfig()):
        layer = QKVParallelLinear(hidden, head_dim, shards["q"].shape[0] // head_dim, 1, bias=True)
    for shard_id, weight in shards.items():
        layer.weight.weight_loader(layer.weight, weight, shard_id)
    for shard_id, part in zip("qkv", bias.split([w.shape[0] for w in shards.values()]), strict=True):
        layer.bias.weight_loader(layer.bias, part, shard_id)
    layer.quant_method.process_weights_after_loading(layer)
    return layer
