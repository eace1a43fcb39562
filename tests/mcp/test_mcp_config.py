"""The --mcp-config file: the servers it names, and the entries it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp_secrets_server import write_config

from wick.mcp import load_mcp_config


def test_config_file(tmp_path: Path) -> None:
    path = write_config(tmp_path / "servers.json", {
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
        load_mcp_config(write_config(tmp_path / "servers.json", servers))
