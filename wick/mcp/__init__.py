"""MCP (Model Context Protocol) tools for the OpenAI server: servers named in a config file, connected at start-up,
whose tools the model may call while wick answers a chat request."""

from wick.mcp.config import HttpServerConfig, ServerConfig, StdioServerConfig, load_mcp_config
from wick.mcp.hub import McpHub, McpTool

__all__ = ["HttpServerConfig", "McpHub", "McpTool", "ServerConfig", "StdioServerConfig", "load_mcp_config"]
