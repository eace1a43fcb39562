"""Rotary position embedding: neox style (the two halves of the rotated dims pair up) or GPT-J style
(dims 2i and 2i+1 pair up), over all of each head or its leading rotary_dim dims (partial RoPE).

Scaling types: default, linear, llama3, yarn and longrope. cos/sin are tabulated once per position.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import nn
from transformers import PretrainedConfig

from wick.layers.norm import RMSNorm

if TYPE_CHECKING:
    from wick.kernels.kv_cache_write import KVCacheTarget


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


def _longrope_inv_freq(base: float, dim: int, factors: list[float]) -> torch.Tensor:
    return 1.0 / (torch.tensor(factors, dtype=torch.float32) * base ** (torch.arange(0, dim, 2).float() / dim))


def _cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, magnitude: float) -> torch.Tensor:
    freqs = torch.outer(positions.float(), inv_freq.float())
    return torch.cat((freqs.cos() * magnitude, freqs.sin() * magnitude), dim=-1)


class RopeInputs(NamedTuple):
    """What the rotary kernel reads beside q, k and their positions (and, where given them, q's and k's per-head RMSNorm
    weights, in q's dtype, and their eps), for a kernel that rotates q and k itself: paged attention at a decode step,
    each at its request's last position."""

    cos_sin_cache: torch.Tensor
    norm_weights: tuple[torch.Tensor, torch.Tensor] | None
    eps: float


def runs_rotary_kernel(q: torch.Tensor) -> bool:
    """Whether q's device runs the Triton rotary kernel (and kernels that rotate as it does): CUDA."""
    return q.is_cuda


class RotaryEmbedding(nn.Module):
    """cos_sin_cache [max_position, rotary_dim]: cos of the rotary_dim / 2 frequencies, then sin."""

    def __init__(self, head_size: int, inv_freq: torch.Tensor, max_position: int, magnitude: float = 1.0,
                 is_neox: bool = True, cache: torch.Tensor | None = None) -> None:
        super().__init__()
        self.head_size = head_size
        self.rotary_dim = 2 * inv_freq.shape[0]
        self.is_neox = is_neox
        if cache is None:
            cache = _cos_sin(inv_freq, torch.arange(max_position), magnitude)
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.view(shape[0], -1, self.head_size)
        rot, rest = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        if self.is_neox:
            x1, x2 = rot.chunk(2, dim=-1)
            rot = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        else:
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
            rot = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
        return torch.cat((rot, rest), dim=-1).view(shape)

    def kernel_inputs(self, q: torch.Tensor, norms: tuple[RMSNorm, RMSNorm] | None = None) -> RopeInputs | None:
        """What the rotary kernel reads beside q and k where it rotates q (and applies `norms` itself), else None."""
        if not (runs_rotary_kernel(q) and self.is_neox and self.rotary_dim == self.head_size):
            return None
        if norms is None:
            return RopeInputs(self.cos_sin_cache, None, 1e-6)
        q_norm, k_norm = norms
        if q_norm.eps != k_norm.eps or not q_norm.weight.dtype == k_norm.weight.dtype == q.dtype:
            return None
        return RopeInputs(self.cos_sin_cache, (q_norm.weight, k_norm.weight), q_norm.eps)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
        norms: tuple[RMSNorm, RMSNorm] | None = None, v: torch.Tensor | None = None,
        cache: KVCacheTarget | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T]; q, k [T, heads * head_size] or [T, heads, head_size]; returns them rotated.
        norms: q's and k's per-head RMSNorms (their subclasses change only how weights load), applied first.
        v and cache: the rotated k and v are written into the cache too (by the rotary kernel where it runs)."""
        inputs = self.kernel_inputs(q, norms)
        if inputs is None and norms is not None:
            q_norm, k_norm = norms
            q = q_norm(q.flatten(1).unflatten(1, (-1, self.head_size)))
            k = k_norm(k.flatten(1).unflatten(1, (-1, self.head_size)))
            inputs = self.kernel_inputs(q)
        if inputs is not None:
            # Imported on first use: Triton fixes at import whether it compiles or interprets its kernels.
            from wick.kernels.rotary import rotary_embedding

            return rotary_embedding(positions, q, k, self.cos_sin_cache, inputs.norm_weights, inputs.eps, v, cache)
        cos, sin = self.cos_sin_cache[positions].to(q.dtype).unsqueeze(1).chunk(2, dim=-1)
        if self.is_neox and self.rotary_dim == self.head_size:
            # Whole heads: x * [cos, cos] + [x2, x1] * [-sin, sin], four ops a tensor instead of a dozen, and
            # the same roundings as x1 * cos - x2 * sin, x2 * cos + x1 * sin (the Triton kernel's).
            cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)
            q, k = self._rotate_whole(q, cos, sin), self._rotate_whole(k, cos, sin)
        else:
            q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
        if cache is not None:
            cache.write(k.view(k.shape[0], -1, self.head_size), v.view(v.shape[0], -1, self.head_size))
        return q, k

    def _rotate_whole(self, x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
        heads = x.view(x.shape[0], -1, self.head_size)
        return (heads * cos + heads.roll(self.head_size // 2, dims=-1) * signed_sin).view(x.shape)


def _longrope(head_size: int, dim: int, max_position: int, base: float, scaling: dict[str, Any],
              is_neox: bool) -> RotaryEmbedding:
    """Phi-3's LongRoPE: positions below original_max_position_embeddings rotate by the short factors,
    the others by the long ones (a pure function of the position, so cached prefixes stay valid)."""
    original = scaling["original_max_position_embeddings"]
    target = scaling.get("max_position_embeddings") or max_position
    factor = scaling.get("factor") or target / original
    magnitude = scaling.get("attention_factor")
    if magnitude is None:
        magnitude = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    max_position = max(max_position, target, original + 1)
    short = _longrope_inv_freq(base, dim, scaling["short_factor"])
    long = _longrope_inv_freq(base, dim, scaling["long_factor"])
    cache = torch.cat((_cos_sin(short, torch.arange(original), magnitude),
                       _cos_sin(long, torch.arange(original, max_position), magnitude)))
    return RotaryEmbedding(head_size, short, max_position, is_neox=is_neox, cache=cache)


def get_rope(
    head_size: int, max_position: int, base: float, rope_scaling: dict[str, Any] | None = None,
    rotary_dim: int | None = None, is_neox: bool = True,
) -> RotaryEmbedding:
    """rope_scaling as returned by rope_parameters(); positions up to the scaled context length.
    rotary_dim (default head_size): the leading dims of each head that rotate."""
    dim = rotary_dim or head_size
    if rope_scaling is None:
        return RotaryEmbedding(head_size, _base_inv_freq(base, dim), max_position, is_neox=is_neox)
    rope_type = rope_scaling["rope_type"]
    if rope_type == "longrope":
        return _longrope(head_size, dim, max_position, base, rope_scaling, is_neox)
    factor = rope_scaling["factor"]
    original = rope_scaling.get("original_max_position_embeddings", max_position)
    max_position = max(max_position, int(original * factor))
    if rope_type == "linear":
        return RotaryEmbedding(head_size, _base_inv_freq(base, dim) / factor, max_position, is_neox=is_neox)
    if rope_type == "llama3":
        return RotaryEmbedding(head_size, _llama3_inv_freq(base, dim, rope_scaling), max_position, is_neox=is_neox)
    if rope_type == "yarn":
        inv_freq, magnitude = _yarn_inv_freq(base, dim, rope_scaling)
        return RotaryEmbedding(head_size, inv_freq, max_position, magnitude, is_neox=is_neox)
    raise ValueError(f"unsupported RoPE type {rope_type!r}; supported: default, linear, llama3, yarn, longrope")
