"""MCP tools (--mcp-config): the config file, the hub over a real stdio server written with the SDK, and `wick serve`
running the tool rounds with the real Qwen2.5-Coder model (which writes its calls as bare hermes JSON)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from wick_server import API_KEY, ServerProcess, process_exists

from wick.mcp import HttpServerConfig, McpHub, StdioServerConfig, load_mcp_config

SERVER_SCRIPT = str(Path(__file__).parent / "mcp_servers" / "secrets_server.py")
SECRET = "48151623"


def _secrets_server(marker: Path) -> dict[str, object]:
    # The marker's path as an argument too, so that this test's server process can be told from others.
    return {"command": sys.executable, "args": [SERVER_SCRIPT, str(marker)], "env": {"WICK_TEST_MARKER": str(marker)}}


def _write_config(path: Path, servers: dict[str, object]) -> str:
    path.write_text(json.dumps({"mcpServers": servers}))
    return str(path)


def _pids_with_argument(argument: str) -> set[int]:
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argument.encode() in cmdline and process_exists(int(entry.name)):
                pids.add(int(entry.name))
    return pids


def _descendants(pid: int) -> set[int]:
    found, stack = set(), [pid]
    while stack:
        parent = stack.pop()
        for children in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                stack.extend(int(child) for child in children.read_text().split())
            except OSError:
                continue
        found.add(parent)
    return found - {pid}


def test_config_file(tmp_path: Path) -> None:
    path = _write_config(tmp_path / "servers.json", {
        "local": {"command": "srv", "args": ["-v"], "env": {"A": "1"}},
        "remote": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer x"}},
    })
    servers = load_mcp_config(path)
    assert list(servers) == ["local", "remote"]
    assert servers["local"].command == "srv" and servers["local"].args == ["-v"]
    assert servers["remote"].url == "https://example.com/mcp"


@pytest.mark.parametrize("servers, message", [
    ({"x": {"args": []}}, "needs either a 'command' or a 'url'"),
    ({"x": {"command": "a", "url": "http://b"}}, "needs either a 'command' or a 'url'"),
    ({"x": {"command": "a", "argz": []}}, "argz"),
    ({"x": {"url": "file:///etc/passwd"}}, "url"),
])
def test_bad_config_file(tmp_path: Path, servers: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_mcp_config(_write_config(tmp_path / "servers.json", servers))


def test_hub_lists_calls_and_closes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    marker = tmp_path / "marker"

    async def scenario() -> None:
        hub = McpHub({
            "one": StdioServerConfig.model_validate(_secrets_server(marker)),
            "two": StdioServerConfig.model_validate(_secrets_server(marker)),
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
            assert len(_pids_with_argument(str(marker))) == 2
        finally:
            await hub.close()
        assert not _pids_with_argument(str(marker))

    asyncio.run(scenario())
    skipped = [r.getMessage() for r in caplog.records if "is skipped" in r.getMessage()]
    assert any("'missing'" in m for m in skipped) and any("'exits'" in m for m in skipped), skipped


def test_hub_over_streamable_http(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/mcp"
    server = subprocess.Popen([sys.executable, SERVER_SCRIPT, "--http", str(port)], stdout=subprocess.DEVNULL,
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


@pytest.fixture(scope="module")
def marker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The file the served secrets server's `write_marker` tool would write."""
    return tmp_path_factory.mktemp("wick-mcp") / "marker"


@pytest.fixture(scope="module")
def mcp_server(marker: Path, qwen_gguf: str) -> Iterator[ServerProcess]:
    """Qwen2.5-Coder with two MCP servers configured: the secrets server, and one that cannot start."""
    folder = marker.parent
    config = _write_config(folder / "servers.json", {
        "secrets": _secrets_server(marker),
        "broken": {"command": str(folder / "no-such-server")},
    })
    process = ServerProcess(["--model", qwen_gguf, "--max-model-len", "2048", "--api-key", API_KEY,
                             "--mcp-config", config], folder / "serve.log")
    yield process
    children = _pids_with_argument(str(marker))
    assert process.stop() == 0, process.log()[-4000:]
    assert not process_exists(process.core_pid)
    assert children and not _pids_with_argument(str(marker)), "the MCP server outlived wick serve"


@pytest.fixture()
def mcp_http(mcp_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=mcp_server.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=600) as c:
        yield c


# The model cannot guess 27.3: its reply holds it only if wick ran the tool and fed the result back.
ASK = [{"role": "user", "content": "What's the weather in Paris?"}]
WEATHER_RESULT = '{"temperature": 27.3, "sky": "sunny"}'


def _served_tools(marker: Path) -> list[dict]:
    """The tools `wick serve` offers the model: the secrets server's, listed here by a hub of our own."""
    async def listing() -> list[dict]:
        hub = McpHub({"secrets": StdioServerConfig.model_validate(_secrets_server(marker))})
        await hub.start()
        try:
            return hub.openai_tools()
        finally:
            await hub.close()

    return asyncio.run(listing())


def _num_tokens(client: httpx.Client, messages: list[dict], tools: list[dict]) -> int:
    response = client.post("/tokenize", json={"messages": messages, "tools": tools})
    assert response.status_code == 200, response.text
    return response.json()["count"]


@pytest.mark.slow
def test_model_calls_an_mcp_tool_and_answers(mcp_server: ServerProcess, mcp_http: httpx.Client, marker: Path) -> None:
    assert "MCP server 'broken' is skipped" in mcp_server.log()
    response = mcp_http.post("/v1/chat/completions", json={"messages": ASK, "temperature": 0, "max_tokens": 200})
    assert response.status_code == 200, response.text
    body = response.json()
    [call] = body["mcp_tool_calls"]
    assert call["name"] == "get_weather" and call["result"] == WEATHER_RESULT
    assert "Paris" in json.loads(call["arguments"])["location"]
    message = body["choices"][0]["message"]
    assert "27.3" in message["content"] and not message.get("tool_calls")
    assert body["choices"][0]["finish_reason"] in ("stop", "length")
    # Usage counts both rounds' prompts: the question with the tools, then that with the call and its result.
    tools = _served_tools(marker)
    assistant = {"role": "assistant", "content": None, "tool_calls": [
        {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}]}
    second = [*ASK, assistant, {"role": "tool", "tool_call_id": call["id"], "content": call["result"]}]
    assert body["usage"]["prompt_tokens"] == _num_tokens(mcp_http, ASK, tools) + _num_tokens(mcp_http, second, tools)
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]


@pytest.mark.slow
def test_streamed_answer_after_mcp_tool_rounds(mcp_http: httpx.Client) -> None:
    request = {"messages": ASK, "temperature": 0, "max_tokens": 200, "stream": True,
               "stream_options": {"include_usage": True}}
    with mcp_http.stream("POST", "/v1/chat/completions", json=request) as response:
        assert response.status_code == 200
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert [(c["name"], c["result"]) for c in chunks[0]["mcp_tool_calls"]] == [("get_weather", WEATHER_RESULT)]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert "27.3" in content
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] > 2 * 100


@pytest.mark.slow
def test_requests_cannot_start_processes_or_run_their_own_tools(mcp_server: ServerProcess, mcp_http: httpx.Client,
                                                                marker: Path, tmp_path: Path) -> None:
    evil = tmp_path / "evil"
    touch = {"command": "touch", "args": [str(evil)]}
    evil_config = _write_config(tmp_path / "evil.json", {"evil": touch})
    before = _descendants(mcp_server.process.pid)
    crafted = {
        "messages": [{"role": "user", "content": "Call the write_marker tool."}], "temperature": 0,
        "max_tokens": 100, "mcpServers": {"evil": touch}, "mcp_config": evil_config, "mcp_servers": {"evil": touch},
        "tools": [{"type": "function", "function": {
            "name": "write_marker", "description": "Writes a marker file.",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}},
            {"type": "mcp", "server_label": "evil", "server_url": "http://127.0.0.1:1/mcp", **touch}],
    }
    response = mcp_http.post("/v1/chat/completions", json=crafted)
    # A tool of an unknown type is refused, or ignored; either way nothing runs.
    assert response.status_code in (200, 400), response.text
    crafted["tools"] = crafted["tools"][:1]
    response = mcp_http.post("/v1/chat/completions", json=crafted)
    assert response.status_code == 200, response.text
    body = response.json()
    # The request brought its own tools: the model's call to `write_marker` is the client's, returned, not run.
    assert "mcp_tool_calls" not in body
    calls = body["choices"][0]["message"].get("tool_calls") or []
    assert [call["function"]["name"] for call in calls] == ["write_marker"]
    assert not evil.exists() and not marker.exists()
    assert _descendants(mcp_server.process.pid) == before
