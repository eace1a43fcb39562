"""The server through the official `openai` client, on the default model."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from wick_server import ServerProcess

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0.0}
FIXED_LENGTH = {"extra_body": {"ignore_eos": True}}


def test_default_model_knows_the_capital_of_france(client: openai.OpenAI):
    response = client.chat.completions.create(model=client.models.list().data[0].id, messages=QUESTION,
                                              max_tokens=32, **GREEDY)
    assert "Paris" in response.choices[0].message.content
    assert response.id.startswith("chatcmpl-") and response.object == "chat.completion"
    assert response.choices[0].message.role == "assistant"
    assert response.choices[0].finish_reason in ("stop", "length")
    assert response.system_fingerprint
    usage = response.usage
    assert usage.prompt_tokens > 0 and 0 < usage.completion_tokens <= 32
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_models_list_the_served_model(client: openai.OpenAI):
    models = client.models.list().data
    assert len(models) == 1 and models[0].object == "model" and "SmolLM2" in models[0].id
    assert client.models.retrieve(models[0].id).id == models[0].id


def test_model_may_be_omitted_or_must_be_served(client: openai.OpenAI):
    served = client.models.list().data[0].id
    response = client.chat.completions.create(model=served, messages=QUESTION, max_tokens=2)
    assert response.model == served
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=QUESTION, max_tokens=2)


def test_api_key_is_required(server: ServerProcess):
    bad = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="x", prompt="hi", max_tokens=1)
    for headers in ({}, {"Authorization": "test-key"}, {"Authorization": "Basic test-key"}):
        response = httpx.get(f"{server.url}/v1/models", headers=headers)
        assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"


def test_chat_stream_has_role_deltas_finish_and_usage(client: openai.OpenAI):
    whole = client.chat.completions.create(model="", messages=QUESTION, max_tokens=10, **GREEDY)
    chunks = list(client.chat.completions.create(model="", messages=QUESTION, max_tokens=10, stream=True,
                                                 stream_options={"include_usage": True}, **GREEDY))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_completion_and_its_stream_agree(client: openai.OpenAI):
    prompt = "The capital of France is"
    whole = client.completions.create(model="", prompt=prompt, max_tokens=8, **GREEDY)
    assert whole.id.startswith("cmpl-") and whole.object == "text_completion"
    assert "Paris" in whole.choices[0].text
    chunks = list(client.completions.create(model="", prompt=prompt, max_tokens=8, stream=True,
                                            stream_options={"include_usage": True}, **GREEDY))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage == whole.usage


def test_n_samples_count_prompt_once_and_every_completion_token(client: openai.OpenAI):
    response = client.chat.completions.create(model="", messages=QUESTION, n=2, max_tokens=8, seed=3,
                                              **FIXED_LENGTH)
    assert sorted(c.index for c in response.choices) == [0, 1]
    assert response.usage.completion_tokens == 16
    single = client.chat.completions.create(model="", messages=QUESTION, max_tokens=1)
    assert response.usage.prompt_tokens == single.usage.prompt_tokens

    chunks = list(client.completions.create(model="", prompt=["One", "Two"], n=2, max_tokens=4, stream=True,
                                            stream_options={"include_usage": True}, **FIXED_LENGTH))
    finished = sorted(c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason)
    assert finished == [0, 1, 2, 3]
    assert chunks[-1].usage.completion_tokens == 16


def test_max_tokens_and_max_completion_tokens(client: openai.OpenAI):
    response = client.completions.create(model="", prompt="Once upon a time", max_tokens=5, **FIXED_LENGTH)
    assert response.usage.completion_tokens == 5 and response.choices[0].finish_reason == "length"
    response = client.chat.completions.create(model="", messages=QUESTION, max_completion_tokens=3, **FIXED_LENGTH)
    assert response.usage.completion_tokens == 3 and response.choices[0].finish_reason == "length"


def test_seed_makes_sampling_reproducible(client: openai.OpenAI):
    def sample(seed: int) -> str:
        return client.completions.create(model="", prompt="My favourite animal is", max_tokens=8,
                                         temperature=1.0, seed=seed, **FIXED_LENGTH).choices[0].text

    # Side by side, so that the engine batches them: a seed holds whatever else runs.
    with ThreadPoolExecutor(4) as pool:
        first, again, *others = pool.map(sample, [1234, 1234, 1, 2])
    assert first == again
    assert len({first, *others}) > 1


def test_stop_string_spanning_two_tokens(client: openai.OpenAI):
    prompt = "The capital of France is"
    free = client.completions.create(model="", prompt=prompt, max_tokens=16, logprobs=0, **GREEDY, **FIXED_LENGTH)
    tokens = free.choices[0].logprobs.tokens
    k = next(i for i in range(1, len(tokens) - 1) if len(tokens[i].strip()) >= 2 and len(tokens[i + 1]) >= 2)
    stop = tokens[k][-2:] + tokens[k + 1][:2]
    expected = free.choices[0].text[:free.choices[0].text.index(stop)]
    for stream in (False, True):
        kwargs = {"model": "", "prompt": prompt, "max_tokens": 16, "stop": [stop], **GREEDY}
        if stream:
            chunks = list(client.completions.create(stream=True, **kwargs))
            text = "".join(c.choices[0].text for c in chunks)
            assert chunks[-1].choices[0].stop_reason == stop
        else:
            response = client.completions.create(**kwargs)
            text = response.choices[0].text
            assert response.choices[0].finish_reason == "stop" and response.choices[0].stop_reason == stop
        assert text == expected
    length = client.completions.create(model="", prompt=prompt, max_tokens=2, **GREEDY, **FIXED_LENGTH)
    assert length.choices[0].finish_reason == "length" and length.choices[0].stop_reason is None


def test_chat_logprobs(client: openai.OpenAI):
    response = client.chat.completions.create(model="", messages=QUESTION, max_tokens=6, logprobs=True,
                                              top_logprobs=3, **GREEDY)
    content = response.choices[0].logprobs.content
    assert len(content) == response.usage.completion_tokens
    assert "".join(entry.token for entry in content).startswith(response.choices[0].message.content[:3])
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        # Greedy: the chosen token is the likeliest.
        assert math.isclose(entry.logprob, entry.top_logprobs[0].logprob, abs_tol=1e-4)
        assert entry.bytes == list(entry.token.encode())


def test_completion_logprobs_and_echo(client: openai.OpenAI):
    prompt = "One, two, three,"
    response = client.completions.create(model="", prompt=prompt, max_tokens=4, logprobs=2, **GREEDY)
    logprobs = response.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 4
    assert all(len(top) <= 3 and max(top.values()) <= 0 for top in logprobs.top_logprobs)
    assert logprobs.text_offset == sorted(logprobs.text_offset)

    echoed = client.completions.create(model="", prompt=prompt, max_tokens=4, logprobs=1, echo=True, **GREEDY)
    assert echoed.choices[0].text == prompt + response.choices[0].text
    assert echoed.choices[0].logprobs.token_logprobs[0] is None
    assert len(echoed.choices[0].logprobs.tokens) == echoed.usage.prompt_tokens + 4


def test_token_id_prompts(client: openai.OpenAI, http):
    tokens = http.post("/tokenize", json={"prompt": "The capital of France is"}).json()["tokens"]
    by_ids = client.completions.create(model="", prompt=tokens, max_tokens=6, **GREEDY)
    by_text = client.completions.create(model="", prompt="The capital of France is", max_tokens=6, **GREEDY)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage == by_text.usage
    two = client.completions.create(model="", prompt=[tokens, tokens[:3]], max_tokens=2, **GREEDY)
    assert [c.index for c in two.choices] == [0, 1]
    # token ids are decoded for an echo (only then): the echo is the prompt's text, streamed or not
    echoed = client.completions.create(model="", prompt=tokens, max_tokens=6, echo=True, **GREEDY)
    assert echoed.choices[0].text == "The capital of France is" + by_text.choices[0].text
    stream = client.completions.create(model="", prompt=tokens, max_tokens=6, echo=True, stream=True, **GREEDY)
    assert "".join(chunk.choices[0].text for chunk in stream if chunk.choices) == echoed.choices[0].text
