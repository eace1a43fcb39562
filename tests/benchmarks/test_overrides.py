import argparse

import pytest

from benchmarks.overrides import add_set_argument, apply_overrides
from wick.kernels import dense_gemv as dense_gemv_module
from wick.kernels import fp8_matmul, paged_attention


@pytest.fixture
def restore(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Every constant a test sets is put back afterwards."""
    for module, name in ((fp8_matmul, "FP8_GEMV_CONFIG"), (dense_gemv_module, "WIDE_GEMV_CONFIG"),
                         (paged_attention, "MIN_SPLIT_TOKENS")):
        monkeypatch.setattr(module, name, getattr(module, name))
    return monkeypatch


def _parse(*argv: str) -> list[str]:
    parser = argparse.ArgumentParser()
    add_set_argument(parser)
    return parser.parse_args(list(argv)).overrides


def test_sets_a_tuple_and_an_int(restore: pytest.MonkeyPatch) -> None:
    apply_overrides(_parse("--set", "wick.kernels.fp8_matmul.FP8_GEMV_CONFIG=2,2048,2",
                           "--set", "wick.kernels.paged_attention.MIN_SPLIT_TOKENS=128"))
    assert fp8_matmul.FP8_GEMV_CONFIG == (2, 2048, 2)
    assert paged_attention.MIN_SPLIT_TOKENS == 128


def test_the_gemv_reads_the_set_config(restore: pytest.MonkeyPatch) -> None:
    """dense_gemv takes default_config's at call time, which reads the module's constant then."""
    apply_overrides(["wick.kernels.dense_gemv.WIDE_GEMV_CONFIG=4,1024,2"])
    assert dense_gemv_module.default_config(8, dense_gemv_module.WIDE_FROM_K) == (4, 1024, 2)


@pytest.mark.parametrize(("item", "message"), [
    ("FP8_GEMV_CONFIG", "expected MODULE.NAME=VALUE"),
    ("wick.kernels.nothing.X=1", "No module named"),
    ("wick.kernels.fp8_matmul.NOTHING=1", "has no NOTHING"),
    ("wick.kernels.fp8_matmul.FP8_GEMV_CONFIG=2,2048", "3 values expected"),
    ("wick.kernels.fp8_matmul.FP8_GEMV_CONFIG=2,x,2", "invalid literal"),
    ("wick.kernels.fp8_matmul.FP8_TILE_CONFIGS=1", "is a list"),
])
def test_bad_items_are_one_line_errors(restore: pytest.MonkeyPatch, item: str, message: str) -> None:
    before = fp8_matmul.FP8_GEMV_CONFIG
    with pytest.raises(SystemExit, match=message):
        apply_overrides([item])
    assert fp8_matmul.FP8_GEMV_CONFIG == before


def test_refused_with_tensor_parallelism() -> None:
    with pytest.raises(SystemExit, match="TP=1"):
        apply_overrides(["wick.kernels.fp8_matmul.FP8_GEMV_CONFIG=2,2048,2"], tensor_parallel_size=2)
    assert apply_overrides([], tensor_parallel_size=2) is None
