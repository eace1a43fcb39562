import pytest
import torch
from torch import nn

from wick.loader.dummy import initialize_dummy_weights
from wick.loader.model_source import resolve_model
from wick.loader.weights import load_weights


class Mixed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 8)
        self.norm = nn.LayerNorm(8)
        self.bf16 = nn.Parameter(torch.zeros(4, 4, dtype=torch.bfloat16))
        self.frozen = nn.Parameter(torch.zeros(3), requires_grad=False)


def _values(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().float().clone() for name, p in model.named_parameters()}


def test_fills_every_parameter_in_range() -> None:
    model = Mixed()
    before = _values(model)
    initialize_dummy_weights(model, seed=0)
    for name, value in _values(model).items():
        assert not torch.equal(value, before[name]), name
        assert value.abs().max() <= 1e-3 * 1.01, name  # bf16 rounding
    assert model.bf16.dtype == torch.bfloat16


def test_deterministic_per_seed() -> None:
    first, second, other = Mixed(), Mixed(), Mixed()
    initialize_dummy_weights(first, seed=3)
    initialize_dummy_weights(second, seed=3)
    initialize_dummy_weights(other, seed=4)
    a, b, c = _values(first), _values(second), _values(other)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert not torch.equal(a["proj.weight"], c["proj.weight"])


def test_load_weights_dummy_source() -> None:
    source = resolve_model("llama-3.2-1b", load_format="dummy")
    model, again = nn.Linear(8, 8), nn.Linear(8, 8)
    load_weights(model, source, seed=7)
    load_weights(again, source, seed=7)
    assert torch.equal(model.weight, again.weight) and torch.equal(model.bias, again.bias)
    assert model.weight.abs().max() <= 1e-3


@pytest.mark.gpu
def test_generates_on_the_parameter_device() -> None:
    model = Mixed().cuda()
    initialize_dummy_weights(model, seed=0)
    assert all(p.is_cuda for p in model.parameters())
    assert model.proj.weight.abs().max() <= 1e-3 and model.proj.weight.abs().sum() > 0
