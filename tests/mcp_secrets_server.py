"""An MCP server for the tests, written with the SDK: a secret number, the weather, a sum, a tool that leaves a marker
file and one that fails; and its entry in an --mcp-config file.

Run as a script it serves over stdio; `--http PORT` serves streamable HTTP at http://127.0.0.1:PORT/mcp instead. The
marker file's path comes from $WICK_TEST_MARKER, so a test can tell whether the tool ever ran. Other arguments are
ignored (tests pass the marker's path as one, to tell their server processes from others).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

SCRIPT = __file__
SECRET_NUMBER = 48151623
# A temperature no model would guess.
WEATHER = {"temperature": 27.3, "sky": "sunny"}

server = MCPServer("secrets")


@server.tool()
def get_secret_number() -> str:
    """Returns the secret number."""
    return f"The secret number is {SECRET_NUMBER}."


@server.tool()
def get_weather(location: str) -> str:
    """The current weather in a city."""
    return json.dumps(WEATHER)


@server.tool()
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


@server.tool()
def write_marker(text: str = "called") -> str:
    """Writes a marker file."""
    Path(os.environ["WICK_TEST_MARKER"]).write_text(text)
    return "written"


@server.tool()
def fail() -> str:
    """Always fails."""
    raise ToolError("the tool broke")


def stdio_config(marker: Path) -> dict[str, object]:
    """This server in --mcp-config's format; the marker's path is an argument too, to find the process by."""
    return {"command": sys.executable, "args": [SCRIPT, str(marker)], "env": {"WICK_TEST_MARKER": str(marker)}}


def write_config(path: Path, servers: dict[str, object]) -> str:
    path.write_text(json.dumps({"mcpServers": servers}))
    return str(path)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
