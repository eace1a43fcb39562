"""The tile kernel over (token, expert) pairs sorted by expert against each pair's product over the torch
dequantizer, experts of every type."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType

from wick.kernels.gemv_split import _arrival_counts as arrival_counts
from wick.kernels.gguf_decode import TRITON_TYPES
from wick.kernels.gguf_tiles import expert_tile_config, gguf_expert_matmul
from wick.kernels.moe_align import moe_align
from wick.loader.gguf_dequant import dequantize

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "layers" / "quantization"))
from gguf_blocks import random_gguf  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


CASES = [(qtype, tokens, split_k) for qtype in sorted(TRITON_TYPES) for tokens, split_k in ((5, 1), (40, 1), (5, 3))]


@pytest.mark.parametrize(("qtype", "tokens", "split_k"), CASES,
                         ids=[f"{qtype.name}-{tokens}-{split_k}" for qtype, tokens, split_k in CASES])
def test_expert_tile_kernel_over_sorted_pairs(qtype: GGMLQuantizationType, tokens: int, split_k: int) -> None:
    experts, n, k, top_k = 4, 40, 512, 2
    weights = [random_gguf(qtype, n, k, seed=30 + e) for e in range(experts)]
    data = torch.stack([w.data for w in weights]).to(DEVICE)
    ids = torch.randint(0, experts, (tokens, top_k), generator=torch.Generator().manual_seed(tokens)).to(DEVICE)
    x = torch.randn(tokens, k, generator=torch.Generator().manual_seed(10)).to(DEVICE)
    config = expert_tile_config(tokens * top_k, experts, x.dtype)
    out = gguf_expert_matmul(x, data, qtype, k, *moe_align(ids, experts, config[0]), config, tokens * top_k, top_k,
                             split_k=split_k)
    dense = [dequantize(w.data, qtype, (n, k)).to(DEVICE) for w in weights]
    expected = torch.stack([x[p // top_k] @ dense[e].t() for p, e in enumerate(ids.flatten().tolist())])
    torch.testing.assert_close(out, expected, atol=1e-5 * expected.abs().max().item(), rtol=0)
    assert not arrival_counts(torch.device(DEVICE)).any()
