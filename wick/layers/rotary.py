"""Rotary position embedding (neox style: the two halves of each head rotate together).

Scaling types: default, linear, llama3 and yarn. cos/sin are tabulated once per position.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from transformers import PretrainedConfig


def rope_parameters(config: PretrainedConfig) -> tuple[float, dict[str, Any] | None]:
    """(theta, scaling) from transformers 5's `rope_parameters` or the older `rope_theta`/`rope_scaling`.

    scaling is None for plain RoPE; otherwise it carries a "rope_type" key.
    """
    params = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    theta = params.pop("rope_theta", None) or getattr(config, "rope_theta", None) or 10000.0
    legacy_type = params.pop("type", None)
    rope_type = params.pop("rope_type", None) or legacy_type or "default"
    if rope_type == "default":
        return float(theta), None
    return float(theta), {**params, "rope_type": rope_type}


def _base_inv_freq(base: float, dim: int) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _llama3_inv_freq(base: float, dim: int, scaling: dict[str, Any]) -> torch.Tensor:
    """Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated."""
    inv_freq = _base_inv_freq(base, dim)
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    smooth = ((old_len / wavelen - low) / (high - low)).clamp(0, 1)
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(base: float, dim: int, scaling: dict[str, Any]) -> tuple[torch.Tensor, float]:
    """NTK-by-parts interpolation; returns the inverse frequencies and the cos/sin magnitude."""
    factor = scaling["factor"]
    old_len = scaling["original_max_position_embeddings"]
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1

    def dim_of(rotations: float) -> float:
        return dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_of(beta_fast), dim_of(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / max(high - low, 1e-3)).clamp(0, 1)
    inv_freq = _base_inv_freq(base, dim)
    inv_freq = inv_freq / factor * ramp + inv_freq * (1 - ramp)

    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)
    return inv_freq, float(attention_factor)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_size: int, inv_freq: torch.Tensor, max_position: int, magnitude: float = 1.0) -> None:
        super().__init__()
        self.head_size = head_size
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq.float())
        cache = torch.cat((freqs.cos() * magnitude, freqs.sin() * magnitude), dim=-1)
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.view(shape[0], -1, self.head_size)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).view(shape)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T]; q, k [T, heads * head_size] or [T, heads, head_size]; returns them rotated."""
        if q.is_cuda:
            # Imported on first use: Triton fixes at import whether it compiles or interprets its kernels.
            from wick.kernels.rotary import rotary_embedding

            return rotary_embedding(positions, q, k, self.cos_sin_cache)
        cos, sin = self.cos_sin_cache[positions].to(q.dtype).unsqueeze(1).chunk(2, dim=-1)
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)


def get_rope(
    head_size: int, max_position: int, base: float, rope_scaling: dict[str, Any] | None = None
) -> RotaryEmbedding:
    """rope_scaling as returned by rope_parameters(); positions up to the scaled context length."""
    if rope_scaling is None:
        return RotaryEmbedding(head_size, _base_inv_freq(base, head_size), max_position)
    rope_type = rope_scaling["rope_type"]
    factor = rope_scaling["factor"]
    original = rope_scaling.get("original_max_position_embeddings", max_position)
    max_position = max(max_position, int(original * factor))
    if rope_type == "linear":
        return RotaryEmbedding(head_size, _base_inv_freq(base, head_size) / factor, max_position)
    if rope_type == "llama3":
        return RotaryEmbedding(head_size, _llama3_inv_freq(base, head_size, rope_scaling), max_position)
    if rope_type == "yarn":
        inv_freq, magnitude = _yarn_inv_freq(base, head_size, rope_scaling)
        return RotaryEmbedding(head_size, inv_freq, max_position, magnitude)
    raise ValueError(f"unsupported RoPE type {rope_type!r}; supported: default, linear, llama3, yarn")
