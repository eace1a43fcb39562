"""Llama 3.1 / 3.2 / 3.3 JSON tool calls: `{"name": ..., "parameters": {...}}` (or "arguments").

The calls are the output itself: one JSON object at its start, or after `<|python_tag|>`, and further objects each
after a `;`. An object is a call only when a `;` or the end of the output follows it; from the first object that is
not a valid call, the rest of the output is content.
"""

from __future__ import annotations

from wick.tools.base import Found, ToolParser, decode_json, function_call, skip_ws

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):
    start_markers = (PYTHON_TAG,)

    def _find_start(self, text: str, at_boundary: bool) -> int | None:
        if at_boundary:
            first = skip_ws(text, 0)
            if text.startswith("{", first):
                return first
        return super()._find_start(text, at_boundary)

    def _parse_call(self, text: str, final: bool) -> Found | None:
        start = skip_ws(text, len(PYTHON_TAG) if text.startswith(PYTHON_TAG) else 0)
        if start == len(text):
            return Found([], None) if final else None
        if text[start] != "{":
            return Found([], None)
        end = self._json_end(text, start)
        if end is None:
            return Found([], None) if final else None
        call = function_call(decode_json(text[start:end]), ("parameters", "arguments"))
        if call is None:
            return Found([], None)
        after = skip_ws(text, end)
        if text.startswith(";", after):
            return Found([call], after + 1)
        if after < len(text):
            return Found([], None)
        return Found([call], after) if final else None
