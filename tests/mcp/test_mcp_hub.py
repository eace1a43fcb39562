"""The MCP hub over real servers written with the SDK (tests/mcp_secrets_server.py), over stdio and streamable HTTP:
tools listed and named, calls and their errors, servers that fail skipped, no process left behind."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from mcp_secrets_server import SCRIPT, SECRET_NUMBER, stdio_config
from processes import pids_with_argument

from wick.mcp import HttpServerConfig, McpHub, StdioServerConfig

SECRET = str(SECRET_NUMBER)


def test_hub_lists_calls_and_closes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    marker = tmp_path / "marker"

    async def scenario() -> None:
        hub = McpHub({
            "one": StdioServerConfig.model_validate(stdio_config(marker)),
            "two": StdioServerConfig.model_validate(stdio_config(marker)),
            "missing": StdioServerConfig(command=str(tmp_path / "no-such-server")),
            "exits": StdioServerConfig(command=sys.executable, args=["-c", "raise SystemExit(3)"]),
        })
        await hub.start()
        try:
            # Both servers offer the same tools: every copy is prefixed with its server's name.
            tools = ("get_secret_number", "get_weather", "add", "write_marker", "fail")
            assert sorted(hub.tools) == sorted(f"{server}_{tool}" for server in ("one", "two") for tool in tools)
            tool = hub.openai_tools()[0]["function"]
            assert tool["name"] == "one_get_secret_number" and tool["parameters"]["type"] == "object"
            assert await hub.call("one_get_secret_number", "{}") == f"The secret number is {SECRET}."
            assert await hub.call("two_add", '{"a": 2, "b": 40}') == "42"
            assert await hub.call("one_fail", "") == "error: Error executing tool fail: the tool broke"
            assert (await hub.call("one_add", '{"a": "x"}')).startswith("error: ")
            assert await hub.call("one_add", "[1, 2]") == "error: the arguments must be a JSON object"
            assert len(pids_with_argument(str(marker))) == 2
        finally:
            await hub.close()
        assert not pids_with_argument(str(marker))

    asyncio.run(scenario())
    skipped = [r.getMessage() for r in caplog.records if "is skipped" in r.getMessage()]
    assert any("'missing'" in m for m in skipped) and any("'exits'" in m for m in skipped), skipped


def test_hub_over_streamable_http(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/mcp"
    server = subprocess.Popen([sys.executable, SCRIPT, "--http", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env={**os.environ, "WICK_TEST_MARKER": str(tmp_path / "m")})
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                httpx.get(url, timeout=1)
                break
            time.sleep(0.1)

        async def scenario() -> None:
            hub = McpHub({"remote": HttpServerConfig(url=url)})
            await hub.start()
            try:
                assert "get_secret_number" in hub.tools
                assert await hub.call("add", '{"a": 1, "b": 2}') == "3"
            finally:
                await hub.close()

        asyncio.run(scenario())
    finally:
        server.terminate()
        server.wait(10)
