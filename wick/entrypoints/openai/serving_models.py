"""The model names this server answers to, and GET /v1/models."""

from __future__ import annotations

import time
from typing import Any

from wick.entrypoints.openai.errors import OpenAIError


class ServingModels:
    """A request may name any of `names` (and its response carries that name), or none (null or ""),
    which stands for `names[0]`."""

    def __init__(self, names: list[str], root: str, max_model_len: int) -> None:
        if not names:
            raise ValueError("a served model needs at least one name")
        self.names = names
        self.root = root
        self.max_model_len = max_model_len
        self.created = int(time.time())

    @property
    def default(self) -> str:
        return self.names[0]

    def resolve(self, requested: str | None) -> str:
        """The name to answer with; 404 when `requested` names a model this server does not serve."""
        if not requested or requested in self.names:
            return requested or self.default
        raise OpenAIError(404, f"The model `{requested}` does not exist. This server serves: {', '.join(self.names)}",
                          param="model", code="model_not_found")

    def card(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": self.created, "owned_by": "wick", "root": self.root,
                "parent": None, "max_model_len": self.max_model_len}

    def list(self) -> dict[str, Any]:
        return {"object": "list", "data": [self.card(name) for name in self.names]}
