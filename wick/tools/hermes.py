"""Hermes-style tool calls (Hermes 2/3, Qwen2.5, Qwen3).

`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`: several calls may follow one another, and text
before them is content. A call is the JSON object after the opening tag, closed by `</tool_call>` (a closing tag
inside a JSON string does not end it). A complete, valid object at the very end of the output without its closing
tag is still a call. Anything else from the opening tag up to the next closing tag (or the end of the output) is
content.
"""

from __future__ import annotations

from wick.tools.base import Found, ToolParser, decode_json, function_call, skip_ws

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


class HermesToolParser(ToolParser):
    start_markers = (OPEN,)
    needs_special_tokens = True  # `<tool_call>` is a special token in some of these tokenizers (Hermes 2 Pro)

    def _parse_call(self, text: str, final: bool) -> Found | None:
        body = skip_ws(text, len(OPEN))
        search_close_from = len(OPEN)
        if text.startswith("{", body):
            end = self._json_end(text, body)
            if end is None:
                if not final:
                    return None
            else:
                call = function_call(decode_json(text[body:end]), ("arguments", "parameters"))
                after = skip_ws(text, end)
                if call is not None:
                    if text.startswith(CLOSE, after):
                        return Found([call], after + len(CLOSE))
                    if CLOSE.startswith(text[after:]):
                        if not final:
                            return None
                        if after == len(text):
                            return Found([call], after)
                search_close_from = after
        elif body == len(text) and not final:
            return None
        close = text.find(CLOSE, search_close_from)
        if close >= 0:
            return Found([], close + len(CLOSE))
        return Found([], len(text)) if final else None
