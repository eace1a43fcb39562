"""Structured output through the server on the default model: response_format, vLLM's guided_* fields, and the
400s for constraints that cannot work."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import jsonschema
import openai
import pytest

PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "pattern": "^[A-Z][a-z]{1,10}$"}, "happy": {"type": "boolean"},
                         "color": {"type": "string", "enum": ["red", "green", "blue"]}},
          "required": ["name", "happy", "color"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Describe a person as JSON with a name, whether they are happy and a color."}]
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def test_json_schema_output_validates_for_many_seeds(async_client: openai.AsyncOpenAI) -> None:
    async def one(seed: int) -> str:
        response = await async_client.chat.completions.create(
            model="", messages=ASK, response_format=JSON_SCHEMA, temperature=1.0, seed=seed, max_tokens=40)
        assert response.choices[0].finish_reason == "stop"
        return response.choices[0].message.content

    async def all_seeds() -> list[str]:
        return await asyncio.gather(*(one(seed) for seed in range(20)))

    texts = asyncio.run(all_seeds())
    for text in texts:
        jsonschema.validate(json.loads(text), PERSON)
    assert len(set(texts)) > 1


def test_json_object_output_parses(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(model="", messages=ASK, response_format={"type": "json_object"},
                                              temperature=0.0, max_tokens=60)
    assert isinstance(json.loads(response.choices[0].message.content), dict)


def test_text_response_format_is_unconstrained(client: openai.OpenAI) -> None:
    question = [{"role": "user", "content": "What is the capital of France?"}]
    plain = client.chat.completions.create(model="", messages=question, temperature=0.0, max_tokens=8)
    text = client.chat.completions.create(model="", messages=question, temperature=0.0, max_tokens=8,
                                          response_format={"type": "text"})
    assert text.choices[0].message.content == plain.choices[0].message.content


def test_guided_choice_picks_one_of_the_choices(client: openai.OpenAI) -> None:
    choices = ["yes", "no", "maybe"]
    response = client.chat.completions.create(
        model="", messages=[{"role": "user", "content": "Is Paris in France?"}], temperature=1.0, seed=3,
        max_tokens=5, extra_body={"guided_choice": choices})
    assert response.choices[0].message.content in choices


def test_completions_take_guided_regex_and_structured_outputs(client: openai.OpenAI) -> None:
    regex = client.completions.create(model="", prompt="The year the Eiffel Tower opened:", max_tokens=8,
                                      temperature=0.0, extra_body={"guided_regex": "[12][0-9]{3}"})
    assert re.fullmatch("[12][0-9]{3}", regex.choices[0].text)
    spec = client.completions.create(model="", prompt="Pick a color:", max_tokens=5, temperature=0.0,
                                     extra_body={"structured_outputs": {"choice": ["red", "blue"]}})
    assert spec.choices[0].text in ("red", "blue")


@pytest.mark.parametrize(("body", "param"), [
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}},
     "response_format.json_schema.schema"),
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"guided_grammar": "root ::= missing"}, "guided_grammar"),
    ({"guided_choice": []}, "guided_choice"),
    ({"structured_outputs": {"regexp": "a+"}}, "structured_outputs"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a+"}, "guided_regex"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"tools": [{"type": "function", "function": {"parameters": {}}}]}, "tools.0.function.name"),
    ({"tools": [WEATHER_TOOL], "tool_choice": "required", "guided_json": {"type": "object"}}, "tool_choice"),
])
def test_unusable_constraints_are_400s_naming_the_field(http: httpx.Client, body: dict, param: str) -> None:
    response = http.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 4, **body})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.json()
