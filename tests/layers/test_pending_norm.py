"""A batch-1 row's RMSNorm left to the layer that reads it: the float GEMV applies it on its way, with no norm
kernel of its own, other layers get the norm kernel's row, and both give what the norm kernel then the layer
give; whole models decode through them as through the norms run first."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from wick.layers.norm import RMSNorm
from wick.layers.pending_norm import PendingNorm
from wick.layers.quantization import unquantized

sys.path.insert(0, str(Path(__file__).resolve().parent / "quantization"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))



def needs_cuda(test: Callable) -> Callable:
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")(test))


def _gptq_checkpoint(hf: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """hf's weights with its projections in GPTQ's 4-bit layout, groups of 128 in order."""
    from int_checkpoints import gptq_tensors
    from quantized_pair import is_projection

    checkpoint = []
    for name, tensor in hf.state_dict().items():
        if is_projection(name):
            tensors, _ = gptq_tensors(tensor, 4, 128, False, True, None)
            checkpoint += [(f"{name.removesuffix('.weight')}.{key}", value) for key, value in tensors.items()]
        else:
            checkpoint.append((name, tensor))
    return checkpoint


def _layer(quantization: str | None) -> torch.nn.Module:
    """The first layer of a small Llama in bf16 on the GPU, its projections quantized in situ to `quantization`, or
    loaded from a GPTQ checkpoint ("gptq")."""
    from quantized_pair import build_ours, small_llama

    from wick.layers.quantization.gptq import GPTQConfig
    from wick.layers.quantization.isq import InSituGGUFConfig

    hf = small_llama()
    checkpoint = hf.state_dict().items()
    if quantization == "gptq":
        config = GPTQConfig.from_config({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False,
                                         "sym": True})
        checkpoint = _gptq_checkpoint(hf)
    else:
        config = InSituGGUFConfig(quantization) if quantization else None
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = build_ours(hf.config, config, checkpoint)
    finally:
        torch.set_default_dtype(default_dtype)
    return model.model.layers[0]


@pytest.mark.parametrize("quantization", [None, "q4_k", "gptq"])
@needs_cuda
def test_readers_apply_the_norm(quantization: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 weights: the GEMVs norm the row themselves (no norm kernel runs); Q4_K and GPTQ ones: the norm kernel
    rounds its row to int8 for the int8 GEMVs, and in the MLP the activation kernel its row for the down projection
    (no rounding kernel runs, nor the plain activation kernel)."""
    # Triton compiles or interprets as a kernel module is first imported
    import wick.kernels.activation as activation_kernels
    import wick.kernels.gguf_int8_gemv as int8_gemv_kernels
    import wick.kernels.rms_norm as rms_norm_kernels
    import wick.kernels.wna16_matmul as wna16_kernels

    layer = _layer(quantization)
    g = torch.Generator(device="cuda").manual_seed(0)
    x, residual = (torch.randn(1, 256, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    mlp = layer.mlp
    for norm, read, reference in (
            (layer.input_layernorm, layer.self_attn.qkv_proj, layer.self_attn.qkv_proj),
            (layer.post_attention_layernorm, lambda h: mlp.gate_up_proj.gated(h, mlp.act_fn),
             lambda h: mlp.act_fn(mlp.gate_up_proj(h))),
            (layer.post_attention_layernorm, mlp, lambda h: mlp.down_proj(mlp.act_fn(mlp.gate_up_proj(h))))):
        normed, expected_residual = norm(x, residual.clone())
        expected = reference(normed)
        with monkeypatch.context() as patch:
            patch.setattr(rms_norm_kernels, "row_norm", lambda *_: pytest.fail("a norm kernel ran"))
            for kernels in (int8_gemv_kernels, wna16_kernels):
                patch.setattr(kernels, "quantize_q8", lambda *_, **__: pytest.fail("a rounding kernel ran"))
            if quantization and read is mlp:
                patch.setattr(activation_kernels, "silu_and_mul", lambda *_: pytest.fail("an activation kernel ran"))
            pending, pending_residual = norm(x, residual.clone(), pending=True)
            assert isinstance(pending, PendingNorm)
            out = read(pending)
        if quantization:  # the same codes reach the same GEMVs
            assert torch.equal(out, expected)
        torch.testing.assert_close(out, expected, atol=2e-2 * expected.abs().max().item(), rtol=0)
        assert torch.equal(pending_residual, expected_residual)
        torch.testing.assert_close(pending.value(), normed, atol=1e-5, rtol=2**-6)
    if quantization == "q4_k":
        assert layer.self_attn.qkv_proj.gguf_parts[0].data.is_cuda


@needs_cuda
def test_value_is_the_norm_kernels_row() -> None:
    """value() without a GEMV having taken the norm: the norm kernel's row and residual, and the norm is spent."""
    layer = _layer(None)
    x, residual = (torch.randn(1, 256, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    normed, expected_residual = layer.input_layernorm(x, residual.clone())
    pending, pending_residual = layer.input_layernorm(x, residual.clone(), pending=True)
    assert torch.equal(pending.value(), normed) and torch.equal(pending_residual, expected_residual)
    assert pending.take() is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="Triton's interpreter runs the kernels on CPU tensors")
@pytest.mark.parametrize("name", ["qwen3", "qwen2_moe", "mixtral"])
def test_models_decode_through_pending_norms(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One sequence's one-token decode steps, float32 on the CPU with the GEMVs (Triton's interpreter) standing in
    for CUDA's batch-1 path: with the norms left pending, every layer's attention and its MLP's gate/up or MoE
    router take them (the experts and shared experts read the router's row), and the logits are those of the
    norms run first."""
    from hf_configs import build_pair, hf_configs
    from paged_generate import PagedRunner

    import wick.kernels.dense_gemv as dense_gemv_kernels

    def one_row_gemv(x: torch.Tensor, weight: torch.Tensor) -> bool:
        return x.numel() == weight.shape[1] and x.dtype == weight.dtype and weight.stride(1) == 1

    def one_row(self: RMSNorm, x: torch.Tensor, residual: torch.Tensor) -> bool:
        return x.dim() == 2 and x.shape[0] == 1 and x.dtype == self.weight.dtype == residual.dtype

    normed_gemvs = []
    gemv = dense_gemv_kernels.dense_gemv

    def counted(*args, norm=None, **kwargs) -> torch.Tensor:
        normed_gemvs.append(norm is not None)
        return gemv(*args, norm=norm, **kwargs)

    monkeypatch.setattr(unquantized, "runs_dense_gemv", one_row_gemv)
    monkeypatch.setattr(dense_gemv_kernels, "dense_gemv", counted)
    config = hf_configs()[name]
    _, ours = build_pair(config)
    prompt = [[5, 17, 42, 9, 77]]
    expected = PagedRunner(ours).generate(prompt, 3)
    assert not any(normed_gemvs)
    monkeypatch.setattr(RMSNorm, "_pends", one_row)
    got = PagedRunner(ours).generate(prompt, 3)
    assert got[0][0] == expected[0][0]
    torch.testing.assert_close(got[0][1], expected[0][1], atol=1e-4, rtol=1e-4)
    # two decode steps of one row, each norm but the first layer's pre-attention one in a GEMV
    assert sum(normed_gemvs) == 2 * (2 * config.num_hidden_layers - 1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="Triton's interpreter runs the kernels on CPU tensors")
@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral"])
def test_moe_models_decode_with_their_pairs_summed_by_the_next_norm(name: str, monkeypatch: pytest.MonkeyPatch
                                                                     ) -> None:
    """The experts' pairs left unsummed (as quantized experts leave them on a GPU; here the reference's products,
    on the CPU): the next layer's pending norm (its kernel in Triton's interpreter) and the final norm sum them, and
    one sequence decodes as with the experts' own sums."""
    from hf_configs import build_pair, hf_configs
    from paged_generate import PagedRunner

    import wick.layers.moe.fused_moe as fused_moe
    from wick.kernels.pair_sum import PairRows

    def unsummed(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor,
                 ids: torch.Tensor) -> PairRows:
        rows = []
        for token, experts in enumerate(ids.tolist()):
            for expert in experts:
                gate, up = torch.nn.functional.linear(x[token], w13[expert]).chunk(2)
                rows.append(torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, w2[expert]))
        returned.append(True)
        return PairRows(torch.stack(rows), weights.float().contiguous())

    def one_row(self: RMSNorm, x: torch.Tensor | PairRows, residual: torch.Tensor) -> bool:
        return len(x.shape) == 2 and x.shape[0] == 1 and x.dtype == self.weight.dtype == residual.dtype

    returned = []
    _, ours = build_pair(hf_configs()[name])
    prompt = [[5, 17, 42, 9, 77]]
    expected = PagedRunner(ours).generate(prompt, 3)
    monkeypatch.setattr(fused_moe, "fused_experts_ref", unsummed)
    monkeypatch.setattr(RMSNorm, "_pends", one_row)
    got = PagedRunner(ours).generate(prompt, 3)
    assert returned
    assert got[0][0] == expected[0][0]
    torch.testing.assert_close(got[0][1], expected[0][1], atol=1e-4, rtol=1e-4)
