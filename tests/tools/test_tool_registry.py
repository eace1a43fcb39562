from __future__ import annotations

import pytest

from wick.tools import (
    DeepSeekR1ReasoningParser,
    HermesToolParser,
    Llama3JsonToolParser,
    MistralToolParser,
    Qwen3ReasoningParser,
    detect_tool_parser,
    get_reasoning_parser,
    get_tool_parser,
)

QWEN25 = (
    '{%- if tools %}\n    {{- \'<|im_start|>system\\n\' }}\n'
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\" }}\n"
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within '
    '<tool_call></tool_call> XML tags:\\n<tool_call>\\n'
    '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}'
    '\\n</tool_call><|im_end|>\\n" }}\n'
)
MISTRAL = (
    "{%- elif message.tool_calls is defined and message.tool_calls is not none %}\n"
    '        {{- "[TOOL_CALLS] [" }}\n        {%- for tool_call in message.tool_calls %}\n'
)
LLAMA31 = (
    '{%- if builtin_tools is defined or tools is not none %}\n    {{- "Environment: ipython\\n" }}\n{%- endif %}\n'
    "{%- if builtin_tool is defined %}\n    {{- '<|python_tag|>' + tool_call.name + '.call(' }}\n"
)
LLAMA32 = (
    "{%- elif message.role == \"tool\" or message.role == \"ipython\" %}\n"
    '        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}\n'
)
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.mark.parametrize("template, name", [(QWEN25, "hermes"), (MISTRAL, "mistral"), (LLAMA31, "llama3_json"),
                                            (LLAMA32, "llama3_json"), (CHATML, None), ("", None), (None, None)])
def test_detect_tool_parser(template: str | None, name: str | None) -> None:
    assert detect_tool_parser(template) == name


def test_get_tool_parser() -> None:
    assert get_tool_parser("hermes") is HermesToolParser
    assert get_tool_parser("qwen") is HermesToolParser
    assert get_tool_parser("llama3_json") is Llama3JsonToolParser
    assert get_tool_parser("mistral") is MistralToolParser
    with pytest.raises(ValueError, match="hermes"):
        get_tool_parser("pythonic")


def test_get_reasoning_parser() -> None:
    assert get_reasoning_parser("deepseek_r1") is DeepSeekR1ReasoningParser
    assert get_reasoning_parser("qwen3") is Qwen3ReasoningParser
    with pytest.raises(ValueError, match="qwen3"):
        get_reasoning_parser("o1")
