"""RoPE tables and rotation against transformers' own rotary embedding."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from wick.layers.rotary import get_rope, rope_parameters

HEAD_DIM, MAX_POS = 64, 512

SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
    "yarn_mscale": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 128,
        "mscale": 0.707,
        "mscale_all_dim": 1.0,
        "beta_fast": 16,
    },
}


def config_with(scaling: dict | None) -> LlamaConfig:
    rope = {"rope_type": "default", **(scaling or {}), "rope_theta": 50000.0}
    return LlamaConfig(
        hidden_size=HEAD_DIM * 4, num_attention_heads=4, max_position_embeddings=MAX_POS, rope_parameters=rope
    )


@pytest.mark.parametrize("kind", sorted(SCALINGS))
def test_rope_matches_transformers(kind: str) -> None:
    config = config_with(SCALINGS[kind])
    rope = get_rope(HEAD_DIM, MAX_POS, *rope_parameters(config))
    positions = torch.tensor([0, 1, 5, 63, 64, 200, 511, 300])
    torch.manual_seed(0)
    q, k = torch.randn(len(positions), 4, HEAD_DIM), torch.randn(len(positions), 2, HEAD_DIM)

    cos, sin = LlamaRotaryEmbedding(config)(q, positions[None])
    hf_q, hf_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    our_q, our_k = rope(positions, q.flatten(1), k)

    torch.testing.assert_close(our_q.view_as(q), hf_q[0].transpose(0, 1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(our_k, hf_k[0].transpose(0, 1), atol=1e-5, rtol=1e-5)


def test_llama3_formula() -> None:
    """Short wavelengths kept, long ones divided by the factor, the band between blended linearly."""
    scaling = SCALINGS["llama3"]
    rope = get_rope(HEAD_DIM, MAX_POS, 50000.0, {**scaling})
    inv_freq = 1.0 / 50000.0 ** (torch.arange(0, HEAD_DIM, 2).double() / HEAD_DIM)
    wavelen = 2 * torch.pi / inv_freq
    old = scaling["original_max_position_embeddings"]
    smooth = ((old / wavelen - 1.0) / (4.0 - 1.0)).clamp(0, 1)
    expected = torch.where(wavelen < old / 4, inv_freq, torch.where(wavelen > old, inv_freq / 8, 0))
    blended = (1 - smooth) * inv_freq / 8 + smooth * inv_freq
    expected = torch.where(expected == 0, blended, expected)
    angle_at_1 = torch.atan2(rope.cos_sin_cache[1, HEAD_DIM // 2 :], rope.cos_sin_cache[1, : HEAD_DIM // 2])
    torch.testing.assert_close(angle_at_1.double(), expected, atol=1e-6, rtol=1e-5)


def test_rope_parameters_both_spellings() -> None:
    old_style = SimpleNamespace(rope_theta=123.0, rope_scaling={"type": "linear", "factor": 2.0})  # transformers 4
    assert rope_parameters(old_style) == (123.0, {"rope_type": "linear", "factor": 2.0})

    new_style = LlamaConfig(rope_parameters={"rope_type": "default", "rope_theta": 7.0})
    assert rope_parameters(new_style) == (7.0, None)


def test_unsupported_rope_type() -> None:
    with pytest.raises(ValueError, match="supported: default, linear, llama3, yarn"):
        get_rope(HEAD_DIM, MAX_POS, 10000.0, {"rope_type": "dynamic", "factor": 2.0})
