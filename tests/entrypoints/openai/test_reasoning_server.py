"""`wick serve --reasoning-parser deepseek_r1` with a chat template of our own on the default model: the output's
text up to </think> is reasoning_content, streamed or not, and chat_template_kwargs reach the template."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from wick_server import ServerProcess

# ChatML that opens the think block in the prompt, unless enable_thinking is false (then it says so instead).
TEMPLATE = (
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor -%}"
    "{%- if enable_thinking is defined and not enable_thinking %}<|im_start|>system\nThinking is off.<|im_end|>\n"
    "{% endif -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)
MESSAGES = [{"role": "system", "content": "Think briefly inside <think> </think>, then answer in one sentence."},
            {"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0.0, "max_tokens": 40}


@pytest.fixture(scope="module")
def reasoning_server(tmp_path_factory: pytest.TempPathFactory, smollm2_gguf: str) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("wick-serve-reasoning")
    template = folder / "template.jinja"
    template.write_text(TEMPLATE)
    process = ServerProcess(["--max-model-len", "2048", "--reasoning-parser", "deepseek_r1",
                             "--chat-template", str(template)], Path(folder) / "serve.log")
    yield process
    assert process.stop() == 0, process.log()[-4000:]


@pytest.fixture(scope="module")
def reasoning_client(reasoning_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{reasoning_server.url}/v1", api_key="none", max_retries=0, timeout=120)


def _expected_split(raw: str) -> tuple[str | None, str | None]:
    """deepseek_r1's rule: everything before </think> (or all of it, without one) is reasoning."""
    reasoning, _, content = raw.partition("</think>")
    reasoning = reasoning.strip().removeprefix("<think>").strip()
    return reasoning or None, content.lstrip() or None


def test_reasoning_content_is_the_text_before_the_closing_tag(reasoning_server: ServerProcess,
                                                             reasoning_client: openai.OpenAI) -> None:
    prompt_ids = httpx.post(f"{reasoning_server.url}/tokenize", json={"messages": MESSAGES}).json()["tokens"]
    raw = reasoning_client.completions.create(model="", prompt=prompt_ids, **GREEDY).choices[0].text
    message = reasoning_client.chat.completions.create(model="", messages=MESSAGES, **GREEDY).choices[0].message
    assert (message.reasoning_content, message.content) == _expected_split(raw)
    chunks = list(reasoning_client.chat.completions.create(model="", messages=MESSAGES, stream=True, **GREEDY))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == (message.reasoning_content or "")
    assert "".join(d.content or "" for d in deltas) == (message.content or "")


def test_enable_thinking_false_reaches_the_template(reasoning_server: ServerProcess,
                                                   reasoning_client: openai.OpenAI) -> None:
    off = {"enable_thinking": False}
    tokenized = httpx.post(f"{reasoning_server.url}/tokenize",
                           json={"messages": MESSAGES, "chat_template_kwargs": off}).json()["tokens"]
    prompt = httpx.post(f"{reasoning_server.url}/detokenize", json={"tokens": tokenized}).json()["prompt"]
    assert "Thinking is off." in prompt
    thinking = reasoning_client.chat.completions.create(model="", messages=MESSAGES, max_tokens=1)
    not_thinking = reasoning_client.chat.completions.create(model="", messages=MESSAGES, max_tokens=1,
                                                            extra_body={"chat_template_kwargs": off})
    assert not_thinking.usage.prompt_tokens == len(tokenized) > thinking.usage.prompt_tokens


def test_without_a_think_token_a_response_format_holds_from_the_first_token(reasoning_client: openai.OpenAI) -> None:
    # SmolLM2 has no </think> token, so the engine could not see the thinking end: the JSON starts at once.
    message = reasoning_client.chat.completions.create(model="", messages=MESSAGES, response_format={
        "type": "json_object"}, temperature=0.0, max_tokens=60).choices[0].message
    assert isinstance(json.loads(message.content), dict) and message.reasoning_content is None
