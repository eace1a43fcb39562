"""Pooling a packed batch (CLS, mean, last token) and the per-request finish (Matryoshka cut, normalisation)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from wick.layers.pooler import PoolerConfig, PoolingType, finish, pool
from wick.pooling_params import PoolingParams


def test_pool_each_span_of_a_packed_batch() -> None:
    hidden = torch.randn(10, 4, generator=torch.Generator().manual_seed(0)).half()
    starts, ends = [0, 3, 4], [3, 4, 10]
    expected = {
        PoolingType.CLS: torch.stack([hidden[s] for s in starts]),
        PoolingType.LAST: torch.stack([hidden[e - 1] for e in ends]),
        PoolingType.MEAN: torch.stack([hidden[s:e].float().mean(0) for s, e in zip(starts, ends, strict=True)]),
    }
    for kind, want in expected.items():
        got = pool(hidden, starts, ends, kind)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want.float(), atol=1e-6, rtol=1e-6)
    # a subset of the spans, in any place of the batch
    torch.testing.assert_close(pool(hidden, [4], [10], PoolingType.MEAN), expected[PoolingType.MEAN][2:])


def test_finish_cuts_and_normalises_per_request() -> None:
    vectors = torch.tensor([[3.0, 4.0, 12.0], [1.0, 0.0, 0.0], [0.0, 3.0, 4.0]])
    rows = finish(vectors, [PoolingParams(), PoolingParams(normalize=False), PoolingParams()], normalize=True)
    torch.testing.assert_close(torch.tensor(rows[0]), F.normalize(vectors[0], dim=0))
    assert rows[1] == [1.0, 0.0, 0.0]
    cut = finish(vectors, [PoolingParams(dimensions=2), PoolingParams(), PoolingParams(dimensions=1)], True)
    assert cut[0] == pytest.approx([0.6, 0.8]) and cut[2] == [0.0] and len(cut[1]) == 3
    assert finish(vectors[:1], [PoolingParams()], normalize=False) == [[3.0, 4.0, 12.0]]


def test_dimensions_only_for_matryoshka_models() -> None:
    plain = PoolerConfig(PoolingType.MEAN, True, 384)
    plain.check(PoolingParams())
    with pytest.raises(ValueError, match="^dimensions: this model does not support Matryoshka"):
        plain.check(PoolingParams(dimensions=128))
    listed = PoolerConfig(PoolingType.LAST, True, 1024, is_matryoshka=True, matryoshka_dimensions=(256, 512))
    listed.check(PoolingParams(dimensions=256))
    with pytest.raises(ValueError, match="not one of the sizes the model supports: 256, 512"):
        listed.check(PoolingParams(dimensions=300))
    with pytest.raises(ValueError, match="more than the model's 1024 dimensions"):
        PoolerConfig(PoolingType.LAST, True, 1024, is_matryoshka=True).check(PoolingParams(dimensions=2048))
    with pytest.raises(ValueError, match="dimensions must be a positive integer"):
        PoolingParams(dimensions=0)
