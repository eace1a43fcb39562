"""`wick serve --mcp-config` with the real Qwen2.5-Coder model (which writes its calls as bare hermes JSON): wick runs
the model's calls to the test MCP server and answers with what they returned; requests cannot start processes. The
server (`mcp_server`, conftest.py) is shared with test_tool_calls.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from mcp_secrets_server import WEATHER, stdio_config, write_config
from processes import descendants
from wick_server import API_KEY, ServerProcess

from wick.mcp import McpHub, StdioServerConfig


@pytest.fixture()
def mcp_http(mcp_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=mcp_server.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=600) as c:
        yield c


# The model cannot guess 27.3: its reply holds it only if wick ran the tool and fed the result back.
ASK = [{"role": "user", "content": "What's the weather in Paris?"}]
WEATHER_RESULT = json.dumps(WEATHER)


def _served_tools(marker: Path) -> list[dict]:
    """The tools `wick serve` offers the model: the secrets server's, listed here by a hub of our own."""
    async def listing() -> list[dict]:
        hub = McpHub({"secrets": StdioServerConfig.model_validate(stdio_config(marker))})
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
    evil_config = write_config(tmp_path / "evil.json", {"evil": touch})
    before = descendants(mcp_server.process.pid)
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
    assert descendants(mcp_server.process.pid) == before
