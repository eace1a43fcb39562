"""The fused gated-activation kernels (SiLU, GELU tanh-approximated and exact) against their pure-torch
references and the layers' torch paths."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from wick.kernels.activation import act_and_mul_q8, gelu_and_mul, gelu_and_mul_ref, silu_and_mul, silu_and_mul_ref
from wick.kernels.int8_activations import quantize_q8
from wick.layers.activation import GeluAndMul, SiluAndMul

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# one ulp of the dtype (exp, tanh, erf and the division may round differently from torch's); a few in fp32
TOLERANCE = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    torch.float16: {"rtol": 2**-10, "atol": 1e-5},
    torch.bfloat16: {"rtol": 2**-7, "atol": 1e-5},
}
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


# activation -> (kernel, reference, layer)
ACTIVATIONS = {
    "silu": (silu_and_mul, silu_and_mul_ref, SiluAndMul),
    "gelu_tanh": (gelu_and_mul, gelu_and_mul_ref, partial(GeluAndMul, "tanh")),
    "gelu": (partial(gelu_and_mul, approximate="none"), partial(gelu_and_mul_ref, approximate="none"),
             partial(GeluAndMul, "none")),
}


def check(x: torch.Tensor, activation: str = "silu") -> None:
    kernel, reference, _ = ACTIVATIONS[activation]
    out = kernel(x)
    expected = reference(x)
    assert out.shape == expected.shape and out.is_contiguous()
    tolerance = dict(TOLERANCE[x.dtype])
    if activation != "silu" and x.dtype != torch.float32:
        # GELU's 1 + tanh or 1 + erf cancels for negative inputs, so an ulp of either moves small outputs by
        # more than an ulp of theirs
        tolerance["atol"] = 2e-3
    torch.testing.assert_close(out, expected, **tolerance)
    if x.dtype != torch.float32:  # fp32 keeps the last bit in which exp implementations differ
        assert (out == expected).float().mean() > (0.99 if activation == "silu" else 0.9)


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("features", [40, 1100])
def test_matches_reference(activation: str, dtype: torch.dtype, features: int) -> None:
    torch.manual_seed(0)
    check(torch.randn(3, 2 * features, dtype=dtype, device=DEVICE) * 4, activation)


def test_strided_rows_and_leading_dims() -> None:
    torch.manual_seed(0)
    wide = torch.randn(4, 2 * 48 + 16, device=DEVICE)
    check(wide[:, : 2 * 48])
    check(torch.randn(2, 3, 64, device=DEVICE))


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_matches_layer_torch_path(activation: str, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    kernel, _, layer = ACTIVATIONS[activation]
    x = torch.randn(5, 64, dtype=dtype) * 4
    torch.testing.assert_close(kernel(x.to(DEVICE)).cpu(), layer()(x), **TOLERANCE[dtype])


@pytest.mark.parametrize("interleave", [False, True], ids=["in_order", "interleaved"])
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_rounds_its_row_to_int8(activation: str, interleave: bool) -> None:
    """The activation kernel rounding its row for an int8 GEMV: exactly the codes, scales and sums quantize_q8 makes
    of the row the kernel writes (1,056 features: the last program's 1,024 only partly in the row)."""
    x = torch.randn(1, 2 * 1056, generator=torch.Generator().manual_seed(9)).to(DEVICE, torch.float16)
    rows = act_and_mul_q8(x, activation, interleave)
    expected = quantize_q8(ACTIVATIONS[activation][0](x), interleave)
    for got, want in zip(rows, expected, strict=True):
        assert torch.equal(got, want)


def test_rejects_odd_width() -> None:
    with pytest.raises(ValueError, match="even"):
        silu_and_mul(torch.randn(2, 7, device=DEVICE))


def test_no_rows() -> None:
    assert silu_and_mul(torch.empty(0, 32, device=DEVICE)).shape == (0, 16)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("num_tokens", [1, 256, 8192])
@pytest.mark.parametrize("features", [3072, 14336])
def test_bf16_cuda(activation: str, num_tokens: int, features: int) -> None:
    torch.manual_seed(0)
    check(torch.randn(num_tokens, 2 * features, dtype=torch.bfloat16, device=DEVICE) * 4, activation)


@pytest.mark.gpu
@needs_cuda
def test_layer_dispatches_and_captures_in_cuda_graph() -> None:
    torch.manual_seed(0)
    layer = SiluAndMul()
    x = torch.randn(8, 2 * 3072, dtype=torch.bfloat16, device=DEVICE)
    layer(x)  # compiles the kernel outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer(x)
    x.normal_()
    graph.replay()
    torch.testing.assert_close(out, silu_and_mul_ref(x), **TOLERANCE[torch.bfloat16])
