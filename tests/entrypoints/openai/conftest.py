"""Fixtures: the default model served by a real `wick serve` process, and clients for it."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from wick_server import API_KEY, ServerProcess


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory, smollm2_gguf: str) -> Iterator[ServerProcess]:
    """The default model (no --model), with an API key."""
    log = tmp_path_factory.mktemp("wick-serve") / "serve.log"
    process = ServerProcess(["--max-model-len", "2048", "--api-key", API_KEY], log)
    yield process
    process.stop_cleanly()


@pytest.fixture(scope="session")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture()
def async_client(server: ServerProcess) -> openai.AsyncOpenAI:
    """One per test: its pooled connections belong to the event loop of the test's asyncio.run."""
    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=300)


@pytest.fixture()
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    """Raw HTTP with the API key."""
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120) as c:
        yield c
