"""Connections to the configured MCP servers, and their tools as the model sees them.

Each server is held by a task of its own, which enters the SDK's transport and session (anyio scopes must be left by
the task that entered them) and waits until the hub closes. A server that fails to start, to initialize or to list
its tools within the time allowed is logged and skipped. Closing the hub ends every session: a stdio server gets
EOF on its stdin, then SIGTERM and SIGKILL if it lingers (the SDK's escalation), so no process outlives the hub.

A tool keeps its own name unless two servers offer the same one; then each copy is named `<server>_<tool>`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import mcp_types
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

from wick.mcp.config import ServerConfig, StdioServerConfig

logger = logging.getLogger(__name__)

# How long a server has to start, initialize and list its tools.
CONNECT_TIMEOUT_S = 30.0
# How long one tool call may take.
CALL_TIMEOUT_S = 120.0
# How long closing waits for the sessions to end (the SDK's own kill escalation takes about 6 s).
_CLOSE_TIMEOUT_S = 15.0
_NOT_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True)
class McpTool:
    name: str  # as offered to the model
    server: str
    server_tool_name: str
    description: str
    parameters: dict[str, Any]

    def openai_tool(self) -> dict[str, Any]:
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


class McpHub:
    def __init__(self, servers: dict[str, ServerConfig]) -> None:
        self.servers = servers
        self.tools: dict[str, McpTool] = {}
        self._sessions: dict[str, ClientSession] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = asyncio.Event()

    def openai_tools(self) -> list[dict[str, Any]]:
        return [tool.openai_tool() for tool in self.tools.values()]

    async def start(self) -> None:
        """Connects to every server at once and collects the tools of those that answer."""
        listings = await asyncio.gather(*(self._connect(name, config) for name, config in self.servers.items()))
        self.tools = _name_tools([(name, tools) for name, tools in zip(self.servers, listings, strict=True)
                                  if tools is not None])

    async def close(self) -> None:
        self._closing.set()
        if not self._tasks:
            return
        _, pending = await asyncio.wait(self._tasks, timeout=_CLOSE_TIMEOUT_S)
        for task in pending:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def call(self, name: str, arguments: str) -> str:
        """Calls a listed tool with the model's arguments (JSON text); the result's text, or "error: ..."."""
        tool = self.tools[name]
        try:
            parsed = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return "error: the arguments are not valid JSON"
        if not isinstance(parsed, dict):
            return "error: the arguments must be a JSON object"
        session = self._sessions.get(tool.server)
        if session is None:
            return f"error: the MCP server {tool.server!r} is not connected"
        try:
            result = await session.call_tool(tool.server_tool_name, parsed, read_timeout_seconds=CALL_TIMEOUT_S)
        except Exception as e:
            logger.warning("MCP tool %r of server %r failed: %s", tool.server_tool_name, tool.server, _describe(e))
            return f"error: {_describe(e)}"
        text = _result_text(result)
        return f"error: {text}" if result.is_error else text

    async def _connect(self, name: str, config: ServerConfig) -> list[mcp_types.Tool] | None:
        ready: asyncio.Future[list[mcp_types.Tool]] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(self._hold(name, config, ready), name=f"mcp-server-{name}")
        try:
            tools = await asyncio.wait_for(asyncio.shield(ready), CONNECT_TIMEOUT_S)
        except Exception as e:
            reason = f"no answer in {CONNECT_TIMEOUT_S:.0f} s" if isinstance(e, TimeoutError) else _describe(e)
            logger.error("MCP server %r is skipped: %s", name, reason)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return None
        self._tasks.append(task)
        logger.info("MCP server %r: %d tool(s): %s", name, len(tools), ", ".join(t.name for t in tools))
        return tools

    async def _hold(self, name: str, config: ServerConfig, ready: asyncio.Future[list[mcp_types.Tool]]) -> None:
        """Opens the session, reports the server's tools through `ready`, and keeps it open until the hub closes."""
        try:
            async with contextlib.AsyncExitStack() as stack:
                if isinstance(config, StdioServerConfig):
                    params = StdioServerParameters(command=config.command, args=config.args, env=config.env,
                                                   cwd=config.cwd)
                    streams = stdio_client(params)
                else:
                    http = await stack.enter_async_context(create_mcp_http_client(headers=config.headers))
                    streams = streamable_http_client(config.url, http_client=http)
                read, write = await stack.enter_async_context(streams)
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                ready.set_result(await _list_tools(session))
                self._sessions[name] = session
                try:
                    await self._closing.wait()
                finally:
                    del self._sessions[name]
        except Exception as e:
            if not ready.done():
                ready.set_exception(e)
            else:
                logger.error("MCP server %r failed: %s", name, _describe(e))


async def _list_tools(session: ClientSession) -> list[mcp_types.Tool]:
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    while True:
        params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
        result = await session.list_tools(params=params)
        tools.extend(result.tools)
        cursor = result.next_cursor
        if not cursor:
            return tools


def _name_tools(listings: list[tuple[str, list[mcp_types.Tool]]]) -> dict[str, McpTool]:
    counts = Counter(tool.name for _, tools in listings for tool in tools)
    named: dict[str, McpTool] = {}
    for server, tools in listings:
        for tool in tools:
            name = tool.name if counts[tool.name] == 1 else _NOT_NAME_CHARS.sub("_", f"{server}_{tool.name}")
            if name in named:
                logger.warning("MCP tool %r of server %r is skipped: the name %r is taken", tool.name, server, name)
                continue
            named[name] = McpTool(name, server, tool.name, tool.description or tool.title or "",
                                  dict(tool.input_schema))
    return named


def _result_text(result: mcp_types.CallToolResult) -> str:
    parts = [block.text if isinstance(block, mcp_types.TextContent) else f"[{block.type} content]"
             for block in result.content]
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False)
    return "\n".join(parts)


def _describe(error: BaseException) -> str:
    """One line for an error, looking inside the exception groups anyio's task groups raise."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return " ".join(str(error).split()) or type(error).__name__
