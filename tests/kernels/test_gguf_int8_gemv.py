"""The int8 GEMVs over (token, expert) pairs against each pair's product over the torch dequantizer."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType

from wick.kernels.gguf_int8_gemv import gguf_expert_gemv
from wick.kernels.int8_activations import quantize_q8_ref
from wick.loader.gguf_dequant import dequantize

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "layers" / "quantization"))
from gguf_blocks import random_gguf  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K, GGMLQuantizationType.Q8_0],
                         ids=lambda t: t.name)
def test_expert_gemv(qtype: GGMLQuantizationType) -> None:
    experts, n, k, tokens, top_k = 3, 24, 512, 3, 2
    weights = [random_gguf(qtype, n, k, seed=20 + e) for e in range(experts)]
    data = torch.stack([w.data for w in weights]).to(DEVICE)
    ids = torch.tensor([2, 0, 1, 1, 0, 2], dtype=torch.int32, device=DEVICE)
    x = torch.randn(tokens, k, generator=torch.Generator().manual_seed(9)).to(DEVICE)
    out = gguf_expert_gemv(x, data, qtype, k, ids, top_k)
    x_seen = quantize_q8_ref(x)
    expected = torch.stack([x_seen[p // top_k] @ dequantize(weights[e].data, qtype, (n, k)).to(DEVICE).t()
                            for p, e in enumerate(ids.tolist())])
    torch.testing.assert_close(out, expected, atol=1e-4 * expected.abs().max().item(), rtol=0)
