"""Hermes-style tool calls (Hermes 2/3, Qwen2.5, Qwen3).

`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`: several calls may follow one another, and text
before them is content. A call is the JSON object after the opening tag, closed by `</tool_call>` (a closing tag
inside a JSON string does not end it). A complete, valid object at the very end of the output without its closing
tag is still a call. Anything else from the opening tag up to the next closing tag (or the end of the output) is
content.

Small models (Qwen2.5-Coder-0.5B among them) often leave the tags out and answer with the bare object, sometimes in
a ```json fence. Such an output is a call when it is nothing but that one object (fence and whitespace aside) and
the object has exactly the keys "name" and "arguments" (or "parameters"): an answer that merely is JSON stays
content.
"""

from __future__ import annotations

from wick.tools.base import Found, ToolParser, decode_json, function_call, skip_ws

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
FENCE = "```"
_BARE_CALL_KEYS = ({"name", "arguments"}, {"name", "parameters"})


class HermesToolParser(ToolParser):
    start_markers = (OPEN,)
    needs_special_tokens = True  # `<tool_call>` is a special token in some of these tokenizers (Hermes 2 Pro)

    def _find_start(self, text: str, at_boundary: bool) -> int | None:
        if at_boundary and self._num_calls == 0:
            first = skip_ws(text, 0)
            if text.startswith(("{", FENCE), first):
                return first
        return super()._find_start(text, at_boundary)

    def _hold_from(self, text: str, at_boundary: bool) -> int:
        hold = super()._hold_from(text, at_boundary)
        if at_boundary and self._num_calls == 0:
            first = skip_ws(text, 0)
            if FENCE.startswith(text[first:]):
                return min(hold, first)
        return hold

    def _parse_call(self, text: str, final: bool) -> Found | None:
        if not text.startswith(OPEN):
            return self._parse_bare(text, final)
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

    def _parse_bare(self, text: str, final: bool) -> Found | None:
        """A call without tags: the whole output is one object, bare or in a ```json fence."""
        fenced = text.startswith(FENCE)
        start = len(FENCE) if fenced else 0
        if fenced:
            language = text[start:start + 4]
            if "json".startswith(language) and len(language) < 4 and start + len(language) == len(text):
                return Found([], len(FENCE)) if final else None
            if language == "json":
                start += 4
            start = skip_ws(text, start)
            if start == len(text):
                return Found([], len(FENCE)) if final else None
            if text[start] != "{":
                return Found([], len(FENCE))
        end = self._json_end(text, start)
        if end is None:
            return Found([], None) if final else None
        value = decode_json(text[start:end])
        call = function_call(value, ("arguments", "parameters")) \
            if isinstance(value, dict) and set(value) in _BARE_CALL_KEYS else None
        if call is None:
            return Found([], None)
        after = skip_ws(text, end)
        if fenced and text.startswith(FENCE, after):
            after = skip_ws(text, after + len(FENCE))
        elif fenced and FENCE.startswith(text[after:]) and after < len(text):
            return Found([call], len(text)) if final else None
        if after < len(text):
            return Found([], None)
        return Found([call], after) if final else None
