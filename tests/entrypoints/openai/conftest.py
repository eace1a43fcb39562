"""Fixtures: the default model served by a real `wick serve` process, and clients for it; Qwen2.5-Coder served with
MCP servers, for the MCP and the tool-call tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from mcp_secrets_server import stdio_config, write_config
from processes import pids_with_argument
from wick_server import API_KEY, ServerProcess


@pytest.fixture(scope="session")
def server(keyed_server: ServerProcess) -> ServerProcess:
    """The default model (no --model), with an API key (and the chat page): ../conftest.py's `keyed_server`."""
    return keyed_server


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


@pytest.fixture(scope="session")
def marker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The file the served secrets server's `write_marker` tool would write."""
    return tmp_path_factory.mktemp("wick-mcp") / "marker"


@pytest.fixture(scope="session")
def mcp_server(marker: Path, qwen_gguf: str) -> Iterator[ServerProcess]:
    """Qwen2.5-Coder with two MCP servers configured: the secrets server, and one that cannot start. Started once for
    test_serving_mcp.py and test_tool_calls.py: a request that brings tools of its own never gets the MCP servers'
    (McpChat.offers), so the tool-call tests' requests take the path they take on a server without --mcp-config."""
    folder = marker.parent
    config = write_config(folder / "servers.json", {
        "secrets": stdio_config(marker),
        "broken": {"command": str(folder / "no-such-server")},
    })
    process = ServerProcess(["--model", qwen_gguf, "--max-model-len", "2048", "--api-key", API_KEY,
                             "--mcp-config", config], folder / "serve.log")
    yield process
    children = pids_with_argument(str(marker))
    process.stop_cleanly()
    assert children and not pids_with_argument(str(marker)), "the MCP server outlived wick serve"
