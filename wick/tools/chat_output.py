"""One choice's output as an assistant message: reasoning, content and tool calls.

The reasoning parser (if any) splits off the reasoning first; the tool parser (if any) then runs on the rest. An
output made under a forced tool choice is a JSON value, not text in the model's own format: it is held back whole
and turned into calls at the end (content, if it is not a valid call). Constrained output never holds reasoning.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from wick.sampling_params import SamplingParams, StructuredOutputsParams
from wick.tools.base import ToolCall, ToolCallDelta, ToolParser, new_tool_call_id
from wick.tools.reasoning import ReasoningParser
from wick.tools.tool_choice import ForcedCall, parse_forced, within_budget


@dataclass
class ChatDelta:
    reasoning: str | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] = field(default_factory=list)


@dataclass
class ChatMessageParts:
    reasoning: str | None
    content: str | None
    tool_calls: list[ToolCall]


class ChatOutputParser:
    """Stateful: one per choice when streaming; `extract` parses a whole output with a fresh one."""

    def __init__(self, reasoning: type[ReasoningParser] | None = None, tools: type[ToolParser] | None = None,
                 forced: ForcedCall | None = None) -> None:
        self._config = (reasoning, tools, forced)
        self._forced = forced
        self._reasoning = reasoning() if reasoning is not None and forced is None else None
        self._tools = tools() if tools is not None and forced is None else None
        self._held = ""

    def feed(self, text: str) -> ChatDelta | None:
        """What the next piece of the output settles; None while nothing is."""
        if self._forced is not None:
            self._held += text
            return None
        if self._reasoning is None:
            return self._split_tools(None, text, final=False)
        reasoning, content = self._reasoning.extract_streaming(text)
        return self._split_tools(reasoning, content, final=False)

    def finish(self) -> ChatDelta | None:
        """End of the output: whatever was held back."""
        if self._forced is not None:
            calls = parse_forced(self._held, self._forced)
            if not calls and self._forced.function is not None and self._held.lstrip().startswith("{"):
                # Cut short (max_tokens): the partial call, as OpenAI returns it with finish_reason "length".
                calls = [ToolCall(new_tool_call_id(), self._forced.function, self._held.strip())]
            if not calls:
                return ChatDelta(content=self._held) if self._held else None
            return ChatDelta(tool_calls=[ToolCallDelta(i, c.id, c.name, c.arguments) for i, c in enumerate(calls)])
        if self._reasoning is None:
            return self._split_tools(None, None, final=True)
        reasoning, content = self._reasoning.finish()
        return self._split_tools(reasoning, content, final=True)

    @property
    def needs_special_tokens(self) -> bool:
        """Whether the output must be detokenized with special tokens kept, for the tool parser's markers."""
        return self._tools is not None and self._tools.needs_special_tokens

    def fresh(self) -> ChatOutputParser:
        """A new parser with the same settings, for another output."""
        return ChatOutputParser(*self._config)

    def extract(self, text: str) -> ChatMessageParts:
        """The parts of a whole output."""
        parser = self.fresh()
        deltas = [d for d in (parser.feed(text), parser.finish()) if d is not None]
        reasoning = "".join(d.reasoning for d in deltas if d.reasoning is not None)
        content = "".join(d.content for d in deltas if d.content is not None)
        calls = [ToolCall(c.id or "", c.name or "", c.arguments or "") for d in deltas for c in d.tool_calls]
        return ChatMessageParts(reasoning or None, content or None, calls)

    def _split_tools(self, reasoning: str | None, content: str | None, final: bool) -> ChatDelta | None:
        delta = ChatDelta(reasoning, content)
        if self._tools is not None:
            pieces = [self._tools.extract_streaming(content) if content else None]
            if final:
                pieces.append(self._tools.finish())
            delta.content = "".join(p.content for p in pieces if p is not None and p.content) or None
            delta.tool_calls = [c for p in pieces if p is not None for c in p.tool_calls]
        if delta.reasoning is None and delta.content is None and not delta.tool_calls:
            return None
        return delta


def tool_call_params(params: SamplingParams, parser: ChatOutputParser, forced: ForcedCall | None) -> SamplingParams:
    """`params` for an output that `parser` reads: held to the forced call's schema (its strings bounded to
    max_tokens), special tokens kept if needed."""
    changes: dict[str, object] = {}
    if forced is not None:
        if params.structured_outputs is not None:
            raise ValueError("a forced tool_choice is itself a structured output; sampling params cannot add another")
        if params.max_tokens is not None:
            forced = within_budget(forced, params.max_tokens)
        changes["structured_outputs"] = StructuredOutputsParams(json=forced.schema)
    if parser.needs_special_tokens:
        changes["skip_special_tokens"] = False
    return params.clone(**changes) if changes else params
