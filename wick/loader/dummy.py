"""Random weights in the right shapes, for benchmarks on machines without the real weights."""

from __future__ import annotations

import torch
from torch import nn

from wick.layers.moe.fused_moe import FusedMoE


def initialize_dummy_weights(model: nn.Module, seed: int = 0, low: float = -1e-3, high: float = 1e-3) -> None:
    """Fill every floating-point parameter in place with values uniform in [low, high], generated on the
    parameter's device (one generator per device, seeded with `seed`): the same seed gives the same
    weights. Quantized layers and packed MoE experts then get random weights of their format (random floats
    quantized)."""
    generators: dict[torch.device, torch.Generator] = {}

    def generator(device: torch.device) -> torch.Generator:
        if device not in generators:
            generators[device] = torch.Generator(device=device).manual_seed(seed)
        return generators[device]

    with torch.no_grad():
        for param in model.parameters():
            if param.is_floating_point() and param.element_size() > 1 and param.numel():
                param.uniform_(low, high, generator=generator(param.device))
        for module in model.modules():
            method = getattr(module, "quant_method", None)
            if method is not None:
                device = next(module.parameters()).device
                method.initialize_dummy(module, generator(device), low, high)
            elif isinstance(module, FusedMoE):
                module.initialize_dummy(generator(next(module.parameters()).device), low, high)
