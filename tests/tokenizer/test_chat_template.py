"""apply_chat_template: our sandboxed rendering gives exactly what transformers gives."""

from __future__ import annotations

import copy
import json

import pytest
from transformers import PreTrainedTokenizerBase

from wick.tokenizer.chat_template import apply_chat_template

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city (°C).",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [
        {"role": "system", "content": "You answer in one sentence."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "It is 4."},
        {"role": "user", "content": "Héllo, 日本語, 😀 — and\n  code:\n\tx = 1"},
    ],
    [
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'},
        {"role": "tool", "tool_call_id": "call_2", "content": "sunny"},
        {"role": "assistant", "content": "It is 21 °C and sunny."},
    ],
]


@pytest.mark.parametrize("tokenizer_name", ["smollm2_tokenizer", "qwen_tokenizer"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", range(len(CONVERSATIONS)))
def test_matches_transformers(request: pytest.FixtureRequest, tokenizer_name: str,
                              add_generation_prompt: bool, conversation: int) -> None:
    tokenizer = request.getfixturevalue(tokenizer_name)
    messages = CONVERSATIONS[conversation]
    given = copy.deepcopy(messages)
    for tools in ([None, [WEATHER_TOOL]] if tokenizer_name == "qwen_tokenizer" else [None]):
        try:
            theirs = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                                   add_generation_prompt=add_generation_prompt)
        except Exception as e:  # SmolLM2's template cannot render a message without content
            with pytest.raises(ValueError, match="chat template error"):
                apply_chat_template(tokenizer, messages, add_generation_prompt=add_generation_prompt, tools=tools)
            assert tokenizer_name == "smollm2_tokenizer", e
            continue
        ours = apply_chat_template(tokenizer, messages, add_generation_prompt=add_generation_prompt, tools=tools)
        assert ours == theirs
    assert messages == given


def test_tools_are_rendered_as_json_keeping_non_ascii(qwen_tokenizer: PreTrainedTokenizerBase) -> None:
    text = apply_chat_template(qwen_tokenizer, CONVERSATIONS[0], tools=[WEATHER_TOOL])
    assert json.dumps(WEATHER_TOOL, ensure_ascii=False) in text
    assert '"arguments": {"city": "Zürich"}' in apply_chat_template(qwen_tokenizer, CONVERSATIONS[2])


@pytest.mark.parametrize("tokenizer_name", ["smollm2_tokenizer", "qwen_tokenizer"])
def test_text_parts_are_joined_for_string_templates(request: pytest.FixtureRequest,
                                                    tokenizer_name: str) -> None:
    tokenizer = request.getfixturevalue(tokenizer_name)
    parts = [{"type": "text", "text": "First line."}, {"type": "text", "text": "Second, 😀."}]
    ours = apply_chat_template(tokenizer, [{"role": "user", "content": parts}])
    theirs = tokenizer.apply_chat_template([{"role": "user", "content": "First line.\nSecond, 😀."}],
                                           tokenize=False, add_generation_prompt=True)
    assert ours == theirs
    with pytest.raises(ValueError, match="image_url"):
        apply_chat_template(tokenizer, [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])


PARTS_TEMPLATE = (
    "{% for m in messages %}{{ m.role }}:{% if m.content is string %}{{ m.content }}"
    "{% else %}{% for p in m.content %}[{{ p.type }}={{ p.text }}]{% endfor %}{% endif %}\n{% endfor %}"
)
ALIASED_PARTS_TEMPLATE = (
    "{% for m in messages %}{% set content = m['content'] %}"
    "{% for p in content %}<{{ p.text }}>{% endfor %}{% endfor %}"
)


@pytest.mark.parametrize(("template", "expected"), [(PARTS_TEMPLATE, "user:[text=a][text=b]"),
                                                    (ALIASED_PARTS_TEMPLATE, "<a><b>")])
def test_templates_that_take_parts_get_the_list(sp_tokenizer: PreTrainedTokenizerBase, template: str,
                                                expected: str) -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    ours = apply_chat_template(sp_tokenizer, messages, chat_template=template)
    assert ours == expected == sp_tokenizer.apply_chat_template(messages, chat_template=template,
                                                                tokenize=False, add_generation_prompt=True)


KWARGS_TEMPLATE = """{{ bos_token }}
{%- for message in messages %}
  {%- if message.role == 'system' %}{{ raise_exception('no system messages, please') }}{% endif %}
<{{ message.role }}>{{ message.content | trim }}{{ eos_token }}
{%- endfor %}
{% if tools %}{{ tools | tojson(indent=2, sort_keys=True) }}{{ tools[0] | tojson(ensure_ascii=True) }}{% endif %}
{%- set ns = namespace(count=0) %}{% for m in messages %}{% set ns.count = ns.count + 1 %}{% endfor %}
count={{ ns.count }} year={{ strftime_now('%Y') }} {{ dict(a=1) | tojson }}
{%- if add_generation_prompt %}<assistant>{% if enable_thinking %}<think>{% else %}<no_think>{% endif %}
{%- endif %}"""


@pytest.mark.parametrize("enable_thinking", [True, False])
def test_extra_kwargs_globals_and_filters(sp_tokenizer: PreTrainedTokenizerBase, enable_thinking: bool) -> None:
    messages = [{"role": "user", "content": "  Grüße 😀  "}, {"role": "assistant", "content": "ok"}]
    kwargs = {"chat_template": KWARGS_TEMPLATE, "tools": [WEATHER_TOOL], "enable_thinking": enable_thinking}
    ours = apply_chat_template(sp_tokenizer, messages, **kwargs)
    assert ours == sp_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                    **kwargs)
    assert ours.startswith("<s>") and "<user>Grüße 😀</s>" in ours and "count=2" in ours
    assert ours.endswith("<think>" if enable_thinking else "<no_think>")
    assert "°C" in ours and "\\u00b0C" in ours  # tojson keeps non-ASCII unless ensure_ascii=True
    with pytest.raises(ValueError, match="no system messages, please"):
        apply_chat_template(sp_tokenizer, [{"role": "system", "content": "x"}], **kwargs)


def test_generation_blocks_render_their_body(sp_tokenizer: PreTrainedTokenizerBase) -> None:
    template = ("{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}A:{{ m.content }}"
                "{% endgeneration %}{% else %}U:{{ m.content }}{% endif %}{% endfor %}")
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    ours = apply_chat_template(sp_tokenizer, messages, chat_template=template, add_generation_prompt=False)
    assert ours == "U:hiA:hello" == sp_tokenizer.apply_chat_template(messages, chat_template=template,
                                                                     tokenize=False)


def test_continue_final_message(qwen_tokenizer: PreTrainedTokenizerBase) -> None:
    for final in ("The answer is", "The answer is "):
        messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": final}]
        ours = apply_chat_template(qwen_tokenizer, messages, add_generation_prompt=False,
                                   continue_final_message=True)
        assert ours == qwen_tokenizer.apply_chat_template(messages, tokenize=False, continue_final_message=True)
        assert ours.endswith(final)
    with pytest.raises(ValueError, match="cannot both"):
        apply_chat_template(qwen_tokenizer, messages, continue_final_message=True)


def test_named_and_missing_templates(sp_tokenizer: PreTrainedTokenizerBase, monkeypatch: pytest.MonkeyPatch) -> None:
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(ValueError, match="no chat template"):
        apply_chat_template(sp_tokenizer, messages)
    monkeypatch.setattr(sp_tokenizer, "chat_template", {"default": "D{{ messages[0].content }}", "tool_use": "T"})
    assert apply_chat_template(sp_tokenizer, messages) == "Dhi"
    assert apply_chat_template(sp_tokenizer, messages, tools=[WEATHER_TOOL]) == "T"
    assert apply_chat_template(sp_tokenizer, messages, chat_template="tool_use") == "T"
    assert apply_chat_template(sp_tokenizer, messages, chat_template="X{{ add_generation_prompt }}") == "XTrue"
    with pytest.raises(ValueError, match="empty"):
        apply_chat_template(sp_tokenizer, [])
    with pytest.raises(ValueError, match="syntax"):
        apply_chat_template(sp_tokenizer, messages, chat_template="{% for %}")


@pytest.mark.parametrize("template", [
    "{{ messages.__class__.__mro__[1].__subclasses__() }}",
    "{{ raise_exception.__globals__ }}{{ raise_exception.__globals__.os }}",
    "{{ messages.append({'role': 'x'}) }}",
    "{{ messages[0].update({'role': 'x'}) }}",
    "{{ messages[0].content.__class__.__base__.__subclasses__() }}",
    "{% set ns = namespace() %}{% set ns.__class__ = 1 %}",
    "{{ namespace(_hidden=1) }}",
    "{{ cycler.__init__.__globals__ }}",
])
def test_sandbox_refuses_unsafe_templates(sp_tokenizer: PreTrainedTokenizerBase, template: str) -> None:
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(ValueError, match="chat template error: .*(unsafe|may not set)"):
        apply_chat_template(sp_tokenizer, messages, chat_template=template)
    assert messages == [{"role": "user", "content": "hi"}]
