"""The quantization flags: vLLM's and candle-vllm's names, turned into EngineArgs; bad values in one line."""

from __future__ import annotations

import pytest

from wick.cli.engine_flags import engine_args_from
from wick.cli.main import build_parser, main


@pytest.mark.parametrize(("flags", "expected"), [
    ([], None), (["--quantization", "fp8"], "fp8"), (["-q", "Q4_K"], "q4_k"), (["--isq", "q4k"], "q4_k"),
])
def test_quantization_flags(flags: list[str], expected: str | None) -> None:
    args = build_parser().parse_args(["generate", "-p", "hello", *flags])
    assert engine_args_from(args).quantization == expected


def test_unknown_quantization_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "-p", "hello", "--isq", "q9k"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "unknown quantization 'q9k'" in err
