"""A batch-1 row's RMSNorm left to the layer that reads it: the float GEMV applies it on its way, with no norm
kernel of its own, other layers get the norm kernel's row, and both give what the norm kernel then the layer
give."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from wick.layers.pending_norm import PendingNorm

sys.path.insert(0, str(Path(__file__).resolve().parent / "quantization"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _layer(quantization: str | None) -> torch.nn.Module:
    """The first layer of a small Llama in bf16 on the GPU, its projections quantized in situ to `quantization`."""
    from quantized_pair import build_ours, small_llama

    from wick.layers.quantization.isq import InSituGGUFConfig

    hf = small_llama()
    config = InSituGGUFConfig(quantization) if quantization else None
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = build_ours(hf.config, config, hf.state_dict().items())
    finally:
        torch.set_default_dtype(default_dtype)
    return model.model.layers[0]


@pytest.mark.parametrize(("quantization", "fused"), [(None, True), ("q4_k", False)])
def test_readers_apply_the_norm(quantization: str | None, fused: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 weights: the GEMVs norm the row themselves (no norm kernel runs); Q4_K ones: the norm kernel runs."""
    import wick.kernels.rms_norm as rms_norm_kernels  # Triton compiles or interprets as it is first imported

    layer = _layer(quantization)
    g = torch.Generator(device="cuda").manual_seed(0)
    x, residual = (torch.randn(1, 256, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for norm, read in ((layer.input_layernorm, layer.self_attn.qkv_proj),
                       (layer.post_attention_layernorm, lambda h: layer.mlp.gate_up_proj.gated(h, layer.mlp.act_fn))):
        normed, expected_residual = norm(x, residual.clone())
        expected = read(normed)
        with monkeypatch.context() as patch:
            if fused:
                patch.setattr(rms_norm_kernels, "row_norm", lambda *_: pytest.fail("a norm kernel ran"))
            pending, pending_residual = norm(x, residual.clone(), pending=True)
            assert isinstance(pending, PendingNorm)
            out = read(pending)
        torch.testing.assert_close(out, expected, atol=2e-2 * expected.abs().max().item(), rtol=0)
        assert torch.equal(pending_residual, expected_residual)
        torch.testing.assert_close(pending.value(), normed, atol=1e-5, rtol=2**-6)
    if quantization:
        assert layer.self_attn.qkv_proj.gguf_parts[0].data.is_cuda


def test_other_readers_get_the_normed_row() -> None:
    """A reader that takes no pending norm (an fp32 F.linear here) gets the norm kernel's row."""
    layer = _layer(None)
    x, residual = (torch.randn(1, 256, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    normed, expected_residual = layer.input_layernorm(x, residual.clone())
    pending, pending_residual = layer.input_layernorm(x, residual.clone(), pending=True)
    assert torch.equal(pending.value(), normed) and torch.equal(pending_residual, expected_residual)
    assert pending.take() is None
