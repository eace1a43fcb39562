"""Random weights in the right shapes, for benchmarks on machines without the real weights."""

from __future__ import annotations

import torch
from torch import nn


def initialize_dummy_weights(model: nn.Module, seed: int = 0, low: float = -1e-3, high: float = 1e-3) -> None:
    """Fill every parameter in place with values uniform in [low, high], generated on the parameter's
    device (one generator per device, seeded with `seed`): the same seed gives the same weights."""
    generators: dict[torch.device, torch.Generator] = {}
    with torch.no_grad():
        for param in model.parameters():
            if param.device not in generators:
                generators[param.device] = torch.Generator(device=param.device).manual_seed(seed)
            param.uniform_(low, high, generator=generators[param.device])
