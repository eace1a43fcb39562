"""Reasoning parsers: split `<think>…</think>` reasoning from the answer.

- `deepseek_r1`: the chat template usually opens `<think>` in the prompt, so the output starts inside the reasoning
  (a `<think>` the model writes itself is skipped) and the answer follows `</think>`. Without `</think>`, all of it is
  reasoning. Also right for templates that open `<think>` themselves, like Qwen3-*-Thinking-2507.
- `qwen3`: reasoning only when the output opens with `<think>` (Qwen3 with `enable_thinking=False` writes no think
  block, so everything is content); it runs to `</think>` or, when cut short, to the end.

The reasoning is stripped of surrounding whitespace and the answer of the whitespace after `</think>`. Streaming
holds back only what might still be part of a tag, and its pieces join to what `extract` returns.
"""

from __future__ import annotations

OPEN = "<think>"
CLOSE = "</think>"


def _tag_prefix_start(text: str, tag: str) -> int:
    """Where the tail of `text` that could be the beginning of `tag` starts (len(text) if none)."""
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-size:]):
            return len(text) - size
    return len(text)


class ReasoningParser:
    """One instance per request (and choice) when streaming."""

    starts_in_reasoning: bool  # whether an output without `<think>` begins inside the reasoning

    def __init__(self) -> None:
        self._buffer = ""
        self._state = "start"  # start -> reasoning -> content, or start -> content
        self._reasoning_started = False  # leading whitespace of the reasoning is dropped
        self._pending_ws = ""  # trailing whitespace of the reasoning so far
        self._content_started = False  # whitespace after </think> is dropped

    def extract(self, text: str) -> tuple[str | None, str | None]:
        """(reasoning_content, content) of a whole output."""
        stream = type(self)()
        pieces = [stream.extract_streaming(text), stream.finish()]
        reasoning = "".join(r for r, _ in pieces if r is not None)
        content = "".join(c for _, c in pieces if c is not None)
        return reasoning or None, content or None

    def extract_streaming(self, delta_text: str) -> tuple[str | None, str | None]:
        """(reasoning delta, content delta) settled by the next piece of the output."""
        self._buffer += delta_text
        return self._advance(final=False)

    def finish(self) -> tuple[str | None, str | None]:
        """End of the output: whatever was held back."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> tuple[str | None, str | None]:
        text = self._buffer
        reasoning = ""
        content = ""
        if self._state == "start":
            head = text.lstrip()
            if head.startswith(OPEN):
                text = head[len(OPEN):]
                self._state = "reasoning"
            elif OPEN.startswith(head) and not final:
                return None, None
            elif self.starts_in_reasoning:
                self._state = "reasoning"
            else:
                self._state = "content"
                self._content_started = True  # no think block: the output is the answer, as it is
        if self._state == "reasoning":
            close = text.find(CLOSE)
            if close >= 0:
                reasoning = self._reasoning(text[:close])
                self._pending_ws = ""
                text = text[close + len(CLOSE):]
                self._state = "content"
            else:
                keep = len(text) if final else _tag_prefix_start(text, CLOSE)
                reasoning = self._reasoning(text[:keep])
                text = text[keep:]
        if self._state == "content":
            if not self._content_started:
                text = text.lstrip()
                self._content_started = bool(text)
            content = text
            text = ""
        self._buffer = text
        return reasoning or None, content or None

    def _reasoning(self, text: str) -> str:
        if not self._reasoning_started:
            text = text.lstrip()
            self._reasoning_started = bool(text)
        text = self._pending_ws + text
        body = text.rstrip()
        self._pending_ws = text[len(body):]
        return body


class DeepSeekR1ReasoningParser(ReasoningParser):
    starts_in_reasoning = True


class Qwen3ReasoningParser(ReasoningParser):
    starts_in_reasoning = False
