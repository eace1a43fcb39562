"""Every kind of bad input gets a 4xx in OpenAI's error shape, never a trace, and the server goes on."""

from __future__ import annotations

import json

import httpx
import pytest

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HELLO = [{"role": "user", "content": "hi"}]


def chat(**fields: object) -> dict:
    return {"messages": HELLO, "max_tokens": 1, **fields}


def completion(**fields: object) -> dict:
    return {"prompt": "hi", "max_tokens": 1, **fields}


def assert_error(response: httpx.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    message = body["error"]["message"]
    assert message and "Traceback" not in message and "pydantic" not in message and "errors.pydantic" not in message
    if param is not None:
        assert body["error"]["param"] == param, body
    return body["error"]


@pytest.fixture(autouse=True)
def still_serving(http: httpx.Client):
    yield
    assert http.get("/health").status_code == 200
    assert http.post("/tokenize", json={"prompt": "still here"}).status_code == 200


@pytest.mark.parametrize(("path", "body", "param"), [
    (CHAT, {"messages": []}, "messages"),
    (CHAT, {}, "messages"),
    (CHAT, {"messages": "hi"}, "messages"),
    (CHAT, {"messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),
    (CHAT, {"messages": [{"content": "hi"}]}, "messages.0.role"),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages.0.content"),
    (CHAT, {"messages": [[{"role": "user", "content": "hi"}]]}, "messages.0"),
    (CHAT, chat(temperature="hot"), "temperature"),
    (CHAT, chat(temperature=-1), "temperature"),
    (CHAT, chat(temperature=3), "temperature"),
    (CHAT, chat(top_p=0), "top_p"),
    (CHAT, chat(n=0), "n"),
    (CHAT, chat(n=10**30), "n"),
    (CHAT, chat(max_tokens=0), "max_tokens"),
    (CHAT, chat(max_tokens=1.5), "max_tokens"),
    (CHAT, chat(max_tokens=10**40), "max_tokens"),
    (CHAT, chat(max_completion_tokens=-3), "max_completion_tokens"),
    (CHAT, chat(seed=2**70), "seed"),
    (CHAT, chat(presence_penalty=5), "presence_penalty"),
    (CHAT, chat(frequency_penalty="x"), "frequency_penalty"),
    (CHAT, chat(logit_bias={"abc": 1}), "logit_bias"),
    (CHAT, chat(logit_bias={"5": 1000}), "logit_bias"),
    (CHAT, chat(logit_bias={"99999999": 1}), None),
    (CHAT, chat(top_logprobs=3), None),
    (CHAT, chat(logprobs=True, top_logprobs=50), "top_logprobs"),
    (CHAT, chat(stop=5), "stop"),
    (CHAT, chat(stop=[""]), "stop"),
    (CHAT, chat(stream="yes please"), "stream"),
    (CHAT, chat(stream_options={"include_usage": "maybe"}), "stream_options.include_usage"),
    (CHAT, chat(min_tokens=5, max_tokens=2), "min_tokens"),
    (CHAT, chat(top_k=-5), "top_k"),
    (CHAT, chat(repetition_penalty=0), "repetition_penalty"),
    (CHAT, chat(stop_token_ids=[-1]), None),
    (CHAT, chat(chat_template_kwargs={"tools": []}), "chat_template_kwargs"),
    (CHAT, chat(messages=[{"role": "assistant", "content": "x"}], add_generation_prompt=True,
                continue_final_message=True), "messages"),
    (COMPLETIONS, {}, "prompt"),
    (COMPLETIONS, completion(prompt=[]), "prompt"),
    (COMPLETIONS, completion(prompt=[1, "a"]), "prompt"),
    (COMPLETIONS, completion(prompt=[[1, 2], []]), "prompt"),
    (COMPLETIONS, completion(prompt={"text": "hi"}), "prompt"),
    (COMPLETIONS, completion(prompt=[1, 10**9]), "prompt"),
    (COMPLETIONS, completion(prompt=[1, -4]), "prompt"),
    (COMPLETIONS, completion(logprobs=21), "logprobs"),
    (COMPLETIONS, completion(echo="no"), "echo"),
    (COMPLETIONS, completion(max_tokens=2048), "max_tokens"),
    (COMPLETIONS, completion(prompt="hello " * 3000), "prompt"),
    (COMPLETIONS, completion(prompt="hello " * 3000, max_tokens=None), "prompt"),
    ("/tokenize", {}, None),
    ("/tokenize", {"prompt": "a", "messages": HELLO}, None),
    ("/detokenize", {"tokens": [10**12]}, "tokens"),
    ("/detokenize", {"tokens": "abc"}, "tokens"),
])
def test_bad_fields_get_400_naming_the_field(http: httpx.Client, path: str, body: dict, param: str | None):
    assert_error(http.post(path, json=body), 400, param)


@pytest.mark.parametrize("stream", [False, True])
def test_too_long_prompt_gets_400_streaming_or_not(http: httpx.Client, stream: bool):
    error = assert_error(http.post(CHAT, json=chat(messages=[{"role": "user", "content": "hello " * 3000}],
                                                   stream=stream)), 400, "messages")
    assert "2048" in error["message"]


@pytest.mark.parametrize("body", [
    b"{", b"", b"not json", b'{"messages": [}', b"\xff\xfe", b"[1, 2, 3]", b"null", b"42",
    b'{"messages": [{"role": "user", "content": "hi"}], "seed": ' + b"9" * 5000 + b"}",
    b"[" * 100_000 + b"]" * 100_000,
    b'{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"x": ' + b"[" * 500 + b"]" * 500
    + b"}}",
])
def test_malformed_json_gets_400(http: httpx.Client, body: bytes):
    assert_error(http.post(CHAT, content=body, headers={"Content-Type": "application/json"}), 400)


def test_wrong_content_type_gets_415(http: httpx.Client):
    body = json.dumps(chat())
    assert_error(http.post(CHAT, content=body, headers={"Content-Type": "text/plain"}), 415)
    assert_error(http.post(CHAT, data={"messages": "hi"}), 415)


def test_unknown_model_route_and_method(http: httpx.Client):
    assert_error(http.post(CHAT, json=chat(model="gpt-4o")), 404, "model")
    assert_error(http.post(COMPLETIONS, json=completion(model="nope")), 404, "model")
    assert_error(http.get("/v1/models/nope"), 404)
    assert_error(http.get("/v1/no/such/route"), 404)
    assert_error(http.get("/no-such-route"), 404)
    assert_error(http.get(CHAT), 405)


def test_body_over_the_limit_gets_413(http: httpx.Client):
    big = b'{"prompt": "' + b"a" * (33 << 20) + b'"}'
    assert_error(http.post(COMPLETIONS, content=big, headers={"Content-Type": "application/json"}), 413)

    def chunks():  # no Content-Length: the limit holds while reading
        yield b'{"prompt": "'
        for _ in range(33):
            yield b"a" * (1 << 20)
        yield b'"}'

    assert_error(http.post(COMPLETIONS, content=chunks(), headers={"Content-Type": "application/json"}), 413)


def test_unknown_fields_are_ignored_and_generation_still_works(http: httpx.Client):
    response = http.post(CHAT, json=chat(frobnicate=True, user="someone", tool_choice="none",
                                         response_format={"type": "text"}))
    assert response.status_code == 200, response.text


def test_text_parts_and_tool_messages_reach_the_template(http: httpx.Client):
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "You are terse."}]},
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}, {"type": "text", "text": "In Paris."}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    response = http.post("/tokenize", json={"messages": messages})
    assert response.status_code == 200, response.text
    text = http.post("/detokenize", json={"tokens": response.json()["tokens"]}).json()["prompt"]
    assert "You are terse." in text and "Weather?\nIn Paris." in text and "sunny" in text
    assert http.post(CHAT, json=chat(messages=messages)).status_code == 200


def test_tokenize_and_detokenize_round_trip(http: httpx.Client):
    response = http.post("/tokenize", json={"prompt": "Hello world"}).json()
    assert response["count"] == len(response["tokens"]) and response["max_model_len"] == 2048
    assert http.post("/detokenize", json={"tokens": response["tokens"]}).json()["prompt"] == "Hello world"


@pytest.mark.parametrize(("path", "body", "param"), [
    (COMPLETIONS, '{"prompt": "hi \\ud800 x", "max_tokens": 3}', "prompt"),
    (CHAT, '{"messages": [{"role": "user", "content": "a\\udc00"}], "max_tokens": 1}', "messages.0.content"),
    ("/tokenize", '{"prompt": "\\ud83d"}', "prompt"),
    (COMPLETIONS, '{"prompt": ["ok", "x\\ud800"], "max_tokens": 1}', "prompt.1"),
])
def test_a_lone_surrogate_gets_400_naming_the_field(http: httpx.Client, path: str, body: str, param: str):
    """JSON's \\u escapes can spell half of a UTF-16 pair, which is no text a tokenizer can encode."""
    response = http.post(path, content=body, headers={"Content-Type": "application/json"})
    assert "surrogate" in assert_error(response, 400, param)["message"]


@pytest.mark.parametrize("body", [
    '{"prompt": "a\ud800b", "max_tokens": 1}'.encode("utf-8", "surrogatepass"),  # the surrogate's UTF-8 bytes
    '{"prompt": "a\ud800b", "max_tokens": 1}'.encode("utf-16-le", "surrogatepass"),
])
def test_a_lone_surrogate_without_an_escape_gets_400(http: httpx.Client, body: bytes):
    """Python's JSON decoder lets a surrogate through from UTF-8's bytes or a UTF-16 body too."""
    response = http.post(COMPLETIONS, content=body, headers={"Content-Type": "application/json"})
    assert "surrogate" in assert_error(response, 400, "prompt")["message"]


def test_nesting_deeper_than_64_levels_gets_400_and_many_shallow_lists_do_not(http: httpx.Client):
    deep = completion(user=json.loads("[" * 70 + "]" * 70))
    assert "nests deeper than 64" in assert_error(http.post(COMPLETIONS, json=deep), 400)["message"]
    shallow = completion(prompt=[[1, 2]] * 63)  # 65 brackets, three levels
    assert http.post(COMPLETIONS, json=shallow).status_code == 200


def test_health_version_and_metrics(http: httpx.Client):
    assert http.get("/version").json()["version"]
    metrics = http.get("/metrics")
    assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
    for name in ("wick:num_requests_running", "wick:num_requests_waiting", "wick:kv_cache_usage_perc",
                 "wick:prompt_tokens_total", "wick:generation_tokens_total", "wick:num_preemptions_total",
                 "wick:prefix_cache_queries_total", "wick:prefix_cache_hits_total",
                 "wick:time_to_first_token_seconds_bucket", "wick:time_per_output_token_seconds_bucket",
                 "wick:e2e_request_latency_seconds_count"):
        assert name in metrics.text, name
        assert name.replace("wick:", "vllm:") in metrics.text, name
    assert http.get("/ping").status_code == http.post("/ping").status_code == 200
