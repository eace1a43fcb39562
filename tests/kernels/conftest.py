"""Without CUDA the kernels run in Triton's interpreter, which must be on (TRITON_INTERPRET=1) both when
a kernel is defined and when it runs. Every wick.kernels module is imported here with it on, and each
test in this folder runs with it on; the variable is put back for the tests that follow."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator

import pytest
import torch

import wick.kernels

INTERPRET = not torch.cuda.is_available()

if INTERPRET:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_INTERPRET", "1")
        for module in pkgutil.iter_modules(wick.kernels.__path__):
            importlib.import_module(f"wick.kernels.{module.name}")


@pytest.fixture(autouse=True)
def triton_interpreter(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if INTERPRET:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    yield
