"""The quantized models are driven by the models' test helper (tests/models/paged_generate.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models"))


@pytest.fixture(autouse=True)
def float32_gguf_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests hold GGUF layers to the float32 dequantization; test_gguf_cpu.py tests the bfloat16 CPU
    kernels that a CPU uses by default."""
    monkeypatch.setenv("WICK_CPU_QUANT_KERNELS", "0")
