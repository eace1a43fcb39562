"""The OpenAI-compatible HTTP server (`wick serve`): api_server.build_app / serve."""
