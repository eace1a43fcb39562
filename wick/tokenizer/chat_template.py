"""Chat templates rendered by wick in a sandboxed jinja2, giving the text transformers would give.

Templates come from model repositories and GGUF files: they are untrusted code. They run in jinja2's
immutable sandbox (no dunder access, no mutating methods on lists and dicts) and see only plain data.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from transformers import PreTrainedTokenizerBase

# Appended to the final message to find where its text ends in the rendered prompt.
_CONTINUE_MARK = "WICK_CONTINUE_FINAL_MESSAGE "
# Older names for a message's reasoning; templates read `reasoning_content`, gpt-oss reads `thinking`.
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")
# Jinja tests a template uses to tell a string content from a list of parts.
_TYPE_TESTS = frozenset({"string", "iterable", "sequence", "mapping"})


def apply_chat_template(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict],
    *,
    add_generation_prompt: bool = True,
    tools: list[dict] | None = None,
    chat_template: str | None = None,
    continue_final_message: bool = False,
    **template_kwargs: Any,
) -> str:
    """Render `messages` with the model's chat template (or `chat_template`, a template or a template name).

    `template_kwargs` reach the template as variables (e.g. `enable_thinking`), after the tokenizer's
    special tokens (`bos_token`, `eos_token`, ...), which they override. Raises ValueError when the
    model has no template or the template fails (its `raise_exception` message included).
    """
    if not messages:
        raise ValueError("cannot apply a chat template to an empty conversation")
    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message and add_generation_prompt cannot both be set")
    source = _select_template(tokenizer, chat_template, tools)
    template, takes_content_lists = _compile(source)

    chat = [_prepare_message(message, takes_content_lists) for message in messages]
    if continue_final_message:
        _mark_final_message(chat)
    variables = {**tokenizer.special_tokens_map, **_plain(template_kwargs)}
    variables.update(messages=chat, tools=_plain(tools), add_generation_prompt=add_generation_prompt)
    try:
        text = template.render(**variables)
    except jinja2.TemplateError as e:
        raise ValueError(f"chat template error: {e.message or e}") from e
    return _cut_at_mark(text) if continue_final_message else text


def _select_template(tokenizer: PreTrainedTokenizerBase, chat_template: str | None,
                     tools: list[dict] | None) -> str:
    model_template = tokenizer.chat_template
    named = model_template if isinstance(model_template, dict) else {}
    if chat_template is not None:
        return named.get(chat_template, chat_template)
    if isinstance(model_template, str):
        return model_template
    if tools and "tool_use" in named:
        return named["tool_use"]
    if "default" in named:
        return named["default"]
    if named:
        raise ValueError(f"the model has several chat templates and no default; name one of {sorted(named)}")
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    raise ValueError(f"the model {name!r} has no chat template; pass one with chat_template")


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks; we only render it."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> nodes.CallBlock:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller: jinja2.runtime.Macro) -> str:
        return caller()


class _Namespace(jinja2.utils.Namespace):
    """jinja2's `namespace()`, refusing attribute names that start with an underscore."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _check_attribute_name(name)
        super().__init__(attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_attribute_name(name)
        super().__setitem__(name, value)


def _check_attribute_name(name: object) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(f"a template may not set the attribute {name!r} on a namespace")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | str | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Unlike jinja2's own tojson, no HTML escaping, and non-ASCII kept as is.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, namespace=_Namespace,
                       dict=_make_dict)
    return env


def _make_dict(*args: Any, **kwargs: Any) -> dict:
    # A function rather than the dict type itself, so the template cannot reach the type's class methods.
    return dict(*args, **kwargs)


@lru_cache(maxsize=32)
def _compile(source: str) -> tuple[jinja2.Template, bool]:
    """The compiled template, and whether it renders message content given as a list of parts."""
    env = _environment()
    try:
        tree = env.parse(source)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"chat template syntax error (line {e.lineno}): {e.message}") from e
    return env.from_string(tree), _handles_content_lists(tree)


def _handles_content_lists(tree: nodes.Template) -> bool:
    """Whether the template loops over message content or tests its type (string or list)."""
    aliases: set[str] = set()

    def is_content(node: nodes.Node) -> bool:
        while isinstance(node, nodes.Filter) and node.node is not None:
            node = node.node
        if isinstance(node, nodes.Getattr):
            return node.attr == "content"
        if isinstance(node, nodes.Getitem):
            return isinstance(node.arg, nodes.Const) and node.arg.value == "content"
        return isinstance(node, nodes.Name) and node.name in aliases

    for assign in tree.find_all(nodes.Assign):
        if isinstance(assign.target, nodes.Name) and is_content(assign.node):
            aliases.add(assign.target.name)
    for loop in tree.find_all(nodes.For):
        if is_content(loop.iter):
            return True
    return any(test.name in _TYPE_TESTS and is_content(test.node) for test in tree.find_all(nodes.Test))


def _prepare_message(message: Mapping[str, Any], takes_content_lists: bool) -> dict[str, Any]:
    if not isinstance(message, Mapping):
        raise TypeError(f"a chat message must be a dict, got {type(message).__name__}")
    # OpenAI clients send `"content": null` and the like; templates expect such keys to be absent.
    prepared = {key: _plain(value) for key, value in message.items() if value is not None}
    content = prepared.get("content")
    if isinstance(content, list) and not takes_content_lists:
        prepared["content"] = _join_text_parts(content)
    reasoning = next((prepared[key] for key in _REASONING_KEYS if key in prepared), None)
    if reasoning is not None:
        prepared.setdefault("thinking", reasoning)
        prepared["reasoning_content"] = reasoning
    return prepared


def _join_text_parts(parts: list[Any]) -> str:
    texts = []
    for part in parts:
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ValueError(f"this model's chat template takes only text content, got a {kind!r} part")
        texts.append(part["text"])
    return "\n".join(texts)


def _mark_final_message(chat: list[dict[str, Any]]) -> None:
    final = chat[-1]
    content = final.get("content")
    if isinstance(content, str):
        final["content"] = content + _CONTINUE_MARK
        return
    text_parts = [part for part in content or [] if isinstance(part, dict) and "text" in part]
    if not text_parts:
        raise ValueError("continue_final_message is set but the final message has no text to continue")
    text_parts[-1]["text"] += _CONTINUE_MARK


def _cut_at_mark(text: str) -> str:
    bare_mark = _CONTINUE_MARK.rstrip()
    at = text.rfind(bare_mark)
    if at < 0:
        raise ValueError("continue_final_message is set but the chat template drops the final message's text")
    if text.startswith(_CONTINUE_MARK, at):
        return text[:at]
    # The template trimmed the message, so the whitespace that ended it is gone too.
    return text[:at].rstrip()


def _plain(value: Any) -> Any:
    """A copy of `value` made of JSON types only, so a template sees no object with methods of its own."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    # A subclass (an enum, a numpy scalar) is brought back to its base type, losing its own methods.
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if callable(getattr(value, "model_dump", None)):
        return _plain(value.model_dump())
    raise TypeError(f"a chat template can only be given JSON-like data, got {type(value).__name__}")
