"""Real-model engines that tests in more than one module (and folder) share, each started once a session: the
default model's `wick serve` with an API key and the chat page, and Qwen2.5-Coder offline."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# wick_server.py lives beside the OpenAI API tests; the web UI tests reach the server below through it too.
sys.path.insert(0, str(Path(__file__).resolve().parent / "openai"))

from wick_server import API_KEY, ServerProcess  # noqa: E402

from wick import LLM  # noqa: E402


@pytest.fixture(scope="session")
def keyed_server(tmp_path_factory: pytest.TempPathFactory, smollm2_gguf: str) -> Iterator[ServerProcess]:
    """The default model (no --model), with an API key and the chat page (--ui): the OpenAI API tests' `server`
    (openai/conftest.py), and the page's API key test (webui/test_webui.py). The page adds `/` and `/ui/`; the API
    tests ask for neither."""
    log = tmp_path_factory.mktemp("wick-serve") / "serve.log"
    process = ServerProcess(["--max-model-len", "2048", "--api-key", API_KEY, "--ui"], log)
    yield process
    process.stop_cleanly()


@pytest.fixture(scope="session")
def qwen_llm(qwen_gguf: str) -> LLM:
    """Qwen2.5-Coder offline, for test_llm.py and test_llm_tools.py (the same settings in both)."""
    return LLM(qwen_gguf, max_model_len=1024)
