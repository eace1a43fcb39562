"""The --mcp-config file, in the format MCP clients share:

    {"mcpServers": {
        "files": {"command": "npx", "args": ["-y", "some-mcp-server"], "env": {"KEY": "value"}},
        "search": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer ..."}}}}

An entry with `command` is a stdio server (a process wick starts); one with `url` is a streamable HTTP server.
This file is the only place a command or a URL can come from: nothing in a request reaches it.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StdioServerConfig(_Entry):
    type: Literal["stdio"] = "stdio"
    command: str = Field(min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] | None = None
    cwd: str | None = None


class HttpServerConfig(_Entry):
    type: Literal["http", "streamable-http", "streamable_http", "streamableHttp"] = "http"
    url: str = Field(pattern=r"^https?://")
    headers: dict[str, str] | None = None


ServerConfig = StdioServerConfig | HttpServerConfig


def load_mcp_config(path: str) -> dict[str, ServerConfig]:
    """The servers a config file names, in its order; ValueError (FileNotFoundError) for a bad (missing) file."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ValueError(f"--mcp-config {path} is not valid JSON: {e}") from e
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise ValueError(f"--mcp-config {path} must hold a JSON object with an 'mcpServers' object")
    configs: dict[str, ServerConfig] = {}
    for name, entry in servers.items():
        if not isinstance(entry, dict) or ("command" in entry) == ("url" in entry):
            raise ValueError(f"--mcp-config {path}: server {name!r} needs either a 'command' or a 'url'")
        kind = StdioServerConfig if "command" in entry else HttpServerConfig
        try:
            configs[name] = kind.model_validate(entry)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
            raise ValueError(f"--mcp-config {path}: server {name!r}: {problems}") from e
    return configs
