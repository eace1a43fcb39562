"""Mistral tool calls, in both of the forms its tokenizers use.

- `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`: a JSON list of calls (tokenizers up to v3).
- `[TOOL_CALLS]name[ARGS]{...}`: one call per marker, repeated for several calls (tokenizers v11 and later).

`[TOOL_CALLS]` is a special token, so the output must be detokenized with special tokens kept. Text before the
first marker is content; text from a marker that is not a valid call up to the next marker stays content.
"""

from __future__ import annotations

import json
import re

from wick.tools.base import Found, ToolParser, decode_json, function_call, skip_ws

MARKER = "[TOOL_CALLS]"
ARGS = "[ARGS]"
_NAME = re.compile(r"[\w.\-]+")


class MistralToolParser(ToolParser):
    start_markers = (MARKER,)
    needs_special_tokens = True

    def _parse_call(self, text: str, final: bool) -> Found | None:
        start = skip_ws(text, len(MARKER))
        if start == len(text):
            return self._not_a_call(text, final)
        if text[start] == "[":
            return self._call_list(text, start, final)
        name = _NAME.match(text, start)
        if name is None:
            return self._not_a_call(text, final)
        if not text.startswith(ARGS, name.end()):
            if ARGS.startswith(text[name.end():]) and not final:
                return None
            return self._not_a_call(text, final)
        arguments_start = skip_ws(text, name.end() + len(ARGS))
        if arguments_start == len(text) and not final:
            return None
        if not text.startswith("{", arguments_start):
            return self._not_a_call(text, final)
        end = self._json_end(text, arguments_start)
        if end is None:
            return self._not_a_call(text, True) if final else None
        arguments = decode_json(text[arguments_start:end])
        if not isinstance(arguments, dict):
            return self._not_a_call(text, final)
        return Found([(name.group(), json.dumps(arguments, ensure_ascii=False))], end)

    def _call_list(self, text: str, start: int, final: bool) -> Found | None:
        end = self._json_end(text, start)
        if end is None:
            return self._not_a_call(text, True) if final else None
        value = decode_json(text[start:end])
        calls = [function_call(item, ("arguments",)) for item in value] if isinstance(value, list) else []
        if not calls or None in calls:
            return self._not_a_call(text, final)
        return Found([call for call in calls if call is not None], end)

    @staticmethod
    def _not_a_call(text: str, final: bool) -> Found | None:
        """Content up to the next marker; unknown until that marker or the end of the output arrives."""
        following = text.find(MARKER, len(MARKER))
        if following >= 0:
            return Found([], following)
        return Found([], len(text)) if final else None
