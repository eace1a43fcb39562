"""Feeding a parser its output in pieces, and the splits the tests feed it with."""

from __future__ import annotations

import json
import random
import re

from wick.tools import ReasoningParser, ToolParser

CALL_ID = re.compile(r"call_[A-Za-z0-9]{24}")


def splits(text: str, seed: int = 0, random_splits: int = 30) -> list[list[str]]:
    """The text whole, in two pieces at every point, one character at a time, and in random pieces."""
    result = [[text]] + [[text[:i], text[i:]] for i in range(len(text) + 1)] + [list(text)]
    rng = random.Random(seed)
    for _ in range(random_splits):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(2, 8)))) if len(text) > 1 else []
        bounds = [0, *cuts, len(text)]
        result.append([text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)])
    return result


def stream_tools(parser_cls: type[ToolParser], pieces: list[str]) -> tuple[str | None, list[tuple[str, str]]]:
    """(content, [(name, arguments)]) the stream adds up to; checks the OpenAI delta shape on the way."""
    parser = parser_cls()
    deltas = [parser.extract_streaming(piece) for piece in pieces] + [parser.finish()]
    content = ""
    calls: dict[int, dict[str, str]] = {}
    for delta in deltas:
        if delta is None:
            continue
        assert delta.content != "" and (delta.content is not None or delta.tool_calls)
        content += delta.content or ""
        for call in delta.tool_calls:
            if call.index not in calls:
                assert call.index == len(calls), "calls are numbered in order"
                assert call.id is not None and CALL_ID.fullmatch(call.id)
                assert call.name
                calls[call.index] = {"name": call.name, "arguments": ""}
            else:
                assert call.id is None and call.name is None, "id and name come once, first"
            calls[call.index]["arguments"] += call.arguments or ""
    return content or None, [(c["name"], c["arguments"]) for c in calls.values()]


def check_tools(parser_cls: type[ToolParser], text: str) -> tuple[str | None, list[tuple[str, dict]]]:
    """Extracts the text whole and streamed every way; all must agree. Returns (content, [(name, arguments)])."""
    extracted = parser_cls().extract(text)
    ids = [call.id for call in extracted.tool_calls]
    assert all(CALL_ID.fullmatch(i) for i in ids) and len(set(ids)) == len(ids)
    expected = (extracted.content, [(call.name, call.arguments) for call in extracted.tool_calls])
    for pieces in splits(text):
        assert stream_tools(parser_cls, pieces) == expected, pieces
    return extracted.content, [(name, json.loads(arguments)) for name, arguments in expected[1]]


def check_reasoning(parser_cls: type[ReasoningParser], text: str) -> tuple[str | None, str | None]:
    """Extracts the text whole and streamed every way; all must agree."""
    expected = parser_cls().extract(text)
    for pieces in splits(text):
        parser = parser_cls()
        outputs = [parser.extract_streaming(piece) for piece in pieces] + [parser.finish()]
        assert all(part != "" for output in outputs for part in output)
        reasoning = "".join(r for r, _ in outputs if r is not None)
        content = "".join(c for _, c in outputs if c is not None)
        assert (reasoning or None, content or None) == expected, pieces
    return expected
