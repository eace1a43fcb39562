"""Tool-call parsing: the shapes handed to the OpenAI layer and the machinery every format shares.

A format says where a call may start (`_find_start`, `_hold_from`) and what the text at such a place is
(`_parse_call`). The segmenter here walks the output with those: the text outside calls is content, each valid call
becomes a ToolCall, and text that looked like a call but is not one stays content. `extract_streaming` runs it over
the text received so far and emits only what no later text can change; `extract` is one stream fed the whole text
at once, so the two always agree. A call is emitted whole (id, name and the complete arguments in one delta) once it
has validated: a call the model gets wrong must come back as content, which a half-sent call could not.

Whitespace that touches a valid call (the newline before `<tool_call>`, the ones between calls) is dropped from the
content; an output without calls comes back unchanged.
"""

from __future__ import annotations

import json
import random
import re
import string
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

_ID_ALPHABET = string.ascii_letters + string.digits
_OUTSIDE_STRING = re.compile(r'["{}\[\]]')
_INSIDE_STRING = re.compile(r'["\\]')


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, serialized as OpenAI returns it


@dataclass
class ExtractedToolCalls:
    content: str | None
    tool_calls: list[ToolCall]


@dataclass
class ToolCallDelta:
    index: int
    id: str | None = None
    name: str | None = None
    arguments: str | None = None


@dataclass
class DeltaMessage:
    content: str | None = None
    tool_calls: list[ToolCallDelta] = field(default_factory=list)


@dataclass(frozen=True)
class Found:
    """What `_parse_call` found at a call start.

    `calls` holds (name, arguments) pairs; empty when the text there is not a valid call, which then stays content.
    `end` is where that text ends, relative to the call start; None means everything to the end of the output is
    content and no more calls are looked for.
    """

    calls: list[tuple[str, str]]
    end: int | None


@dataclass
class _Scan:
    """How far the search for the end of one JSON value got; positions count from the start of the output."""

    start: int
    pos: int
    depth: int = 0
    in_string: bool = False
    end: int | None = None


def new_tool_call_id() -> str:
    return "call_" + "".join(random.choices(_ID_ALPHABET, k=24))


def skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def function_call(value: Any, argument_keys: tuple[str, ...]) -> tuple[str, str] | None:
    """(name, arguments as JSON) from a decoded call object, or None if it is not one."""
    if not isinstance(value, dict):
        return None
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return None
    arguments = next((value[key] for key in argument_keys if key in value), {})
    if isinstance(arguments, str):  # some models send the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return name, json.dumps(arguments, ensure_ascii=False)


def decode_json(text: str) -> Any:
    """The decoded value, or None when the text is not JSON (a JSON null is no call either)."""
    try:
        return json.loads(text)
    except ValueError:
        return None


class ToolParser(ABC):
    """Splits a model's output into content and tool calls; one instance per request (and choice) when streaming."""

    start_markers: tuple[str, ...] = ()
    # The server must detokenize with special tokens kept, or the markers never reach the parser.
    needs_special_tokens: bool = False

    def __init__(self) -> None:
        self._buffer = ""  # received, not yet settled
        self._pending_ws = ""  # trailing whitespace of the content: dropped if a call follows
        self._after_call = False  # right after a call: leading whitespace is dropped
        self._boundary = True  # no content since the start of the output or the last call
        self._plain = False  # the rest of the output is content
        self._num_calls = 0
        self._offset = 0  # where the text given to `_parse_call` starts in the output
        self._scan: _Scan | None = None

    def extract(self, text: str) -> ExtractedToolCalls:
        """The content and the tool calls of a whole output."""
        stream = type(self)()
        deltas = [stream.extract_streaming(text), stream.finish()]
        content = "".join(d.content for d in deltas if d is not None and d.content is not None)
        calls = [ToolCall(c.id or "", c.name or "", c.arguments or "") for d in deltas if d is not None
                 for c in d.tool_calls]
        return ExtractedToolCalls(content or None, calls)

    def extract_streaming(self, delta_text: str) -> DeltaMessage | None:
        """What the next piece of the output settles: content and whole calls; None while nothing is settled."""
        self._buffer += delta_text
        return self._advance(final=False)

    def finish(self) -> DeltaMessage | None:
        """End of the output: what was held back, with any call that never completed returned as content."""
        return self._advance(final=True)

    def _find_start(self, text: str, at_boundary: bool) -> int | None:
        """Where the first call in `text` starts, if one does."""
        found = [i for i in (text.find(marker) for marker in self.start_markers) if i >= 0]
        return min(found) if found else None

    def _hold_from(self, text: str, at_boundary: bool) -> int:
        """Where the tail of `text` (which holds no call start) might still grow into one."""
        for size in range(min(len(text), max(map(len, self.start_markers)) - 1), 0, -1):
            if any(marker.startswith(text[-size:]) for marker in self.start_markers):
                return len(text) - size
        return len(text)

    @abstractmethod
    def _parse_call(self, text: str, final: bool) -> Found | None:
        """What the text at a call start is; None while later text could still change the answer.

        Once it answers, it must answer the same for every longer text: that is what makes streaming exact.
        """

    def _advance(self, final: bool) -> DeltaMessage | None:
        content: list[str] = []
        calls: list[ToolCallDelta] = []
        text = self._buffer
        while text:
            if self._plain:
                content.append(self._content(text))
                text = self._drop(text, len(text))
                break
            start = self._find_start(text, self._boundary)
            if start is None:
                keep = len(text) if final else self._hold_from(text, self._boundary)
                content.append(self._content(text[:keep]))
                text = self._drop(text, keep)
                break
            content.append(self._content(text[:start]))
            text = self._drop(text, start)
            found = self._parse_call(text, final)
            if found is None:
                break
            if found.end is None:
                self._plain = True
            elif found.calls:
                self._pending_ws = ""
                self._after_call = self._boundary = True
                for name, arguments in found.calls:
                    calls.append(ToolCallDelta(self._num_calls, new_tool_call_id(), name, arguments))
                    self._num_calls += 1
                text = self._drop(text, found.end)
            else:
                content.append(self._content(text[:found.end]))
                text = self._drop(text, found.end)
        self._buffer = text
        if final:
            content.append(self._pending_ws)
            self._pending_ws = ""
        joined = "".join(content)
        if not joined and not calls:
            return None
        return DeltaMessage(joined or None, calls)

    def _drop(self, text: str, size: int) -> str:
        self._offset += size
        return text[size:]

    def _json_end(self, text: str, pos: int) -> int | None:
        """End of the JSON object or array opening at text[pos] (`text` as given to `_parse_call`); None while open.

        Found by bracket depth outside strings: for valid JSON that is where the value ends, for invalid JSON only
        where a parse attempt should stop. The scan resumes where the last look at the same value stopped, so a long
        call streams in linear time.
        """
        scan = self._scan
        if scan is None or scan.start != self._offset + pos:
            scan = self._scan = _Scan(self._offset + pos, self._offset + pos)
        i = scan.pos - self._offset
        while scan.end is None:
            if scan.in_string:
                match = _INSIDE_STRING.search(text, i)
                if match is None:
                    i = len(text)
                elif match.group() == '"':
                    scan.in_string = False
                    i = match.end()
                    continue
                elif match.end() < len(text):
                    i = match.end() + 1  # past the escaped character
                    continue
                else:
                    i = match.start()  # the escaped character has not arrived
                break
            match = _OUTSIDE_STRING.search(text, i)
            if match is None:
                i = len(text)
                break
            i = match.end()
            if match.group() == '"':
                scan.in_string = True
            elif match.group() in "{[":
                scan.depth += 1
            else:
                scan.depth -= 1
                if scan.depth == 0:
                    scan.end = self._offset + i
        scan.pos = self._offset + i
        return None if scan.end is None else scan.end - self._offset

    def _content(self, text: str) -> str:
        """The part of a content piece that can be sent now."""
        if self._after_call:
            text = text.lstrip()
            if not text:
                return ""
            self._after_call = False
        text = self._pending_ws + text
        body = text.rstrip()
        self._pending_ws = text[len(body):]
        if body:
            self._boundary = False
        return body
