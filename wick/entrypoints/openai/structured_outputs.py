"""A request's output constraint: OpenAI's response_format, vLLM's guided_* and structured_outputs fields, or a
forced tool call, as StructuredOutputsParams. Checked here, before the request reaches the engine, so that a bad
schema, regex or grammar is a 400 naming its field."""

from __future__ import annotations

import json
import re
from typing import Any

from wick.entrypoints.openai.errors import bad_request
from wick.entrypoints.openai.protocol import SamplingRequest
from wick.sampling_params import StructuredOutputsParams
from wick.tools.tool_choice import ForcedCall

_LOCATION = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*")
_KEYS = ("json", "json_object", "regex", "choice", "grammar")


def structured_outputs(request: SamplingRequest, forced: ForcedCall | None = None) -> StructuredOutputsParams | None:
    given: list[tuple[str, dict[str, Any]]] = []
    response_format = request.response_format
    if response_format is not None and response_format.type != "text":
        schema = response_format.json_schema.json_schema \
            if response_format.type == "json_schema" and response_format.json_schema is not None else None
        if schema is None:
            given.append(("response_format", {"json_object": True}))
        else:
            given.append(("response_format.json_schema.schema", {"json": schema}))
    for field, key in (("guided_json", "json"), ("guided_regex", "regex"), ("guided_choice", "choice"),
                       ("guided_grammar", "grammar")):
        value = getattr(request, field)
        if value is not None:
            given.append((field, {key: value}))
    if request.structured_outputs is not None:
        unknown = sorted(set(request.structured_outputs) - set(_KEYS))
        if unknown:
            raise bad_request(f"structured_outputs: unknown keys {unknown}; use {', '.join(_KEYS)}",
                              "structured_outputs")
        given.append(("structured_outputs", request.structured_outputs))
    if forced is not None:
        given.append(("tool_choice", {"json": forced.schema}))
    if not given:
        return None
    if len(given) > 1:
        names = sorted({field.split(".")[0] for field, _ in given})
        raise bad_request(f"give at most one output constraint; got {', '.join(names)}", given[1][0])
    field, spec = given[0]
    try:
        params = StructuredOutputsParams(**spec)
    except ValueError as e:
        raise bad_request(f"{field}: {e}", field) from e
    _check_compiles(params, "tools" if field == "tool_choice" else field)
    return params


def _check_compiles(params: StructuredOutputsParams, field: str) -> None:
    """Builds the grammar (without the tokenizer, which the engine core adds) to find what xgrammar refuses."""
    import xgrammar as xgr

    if params.json is not None:
        kind, build = "JSON schema", lambda: xgr.Grammar.from_json_schema(json.dumps(params.json), any_whitespace=False)
    elif params.regex is not None:
        kind, build = "regular expression", lambda: xgr.Grammar.from_regex(params.regex)
    elif params.grammar is not None:
        kind, build = "grammar", lambda: xgr.Grammar.from_ebnf(params.grammar)
    else:
        return
    try:
        build()
    except (RuntimeError, ValueError) as e:
        # xgrammar's messages start with a time stamp and its source location.
        reason = _LOCATION.sub("", str(e).strip().splitlines()[0])
        raise bad_request(f"{field}: not a usable {kind}: {reason}", field) from None
