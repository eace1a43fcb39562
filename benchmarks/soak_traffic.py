"""The soak's mixed traffic: one coroutine per kind of request, each returning what it saw and, when the
answer is not what that request should get, why. Every request to a generation route may also get a
429 (bursts fill the queue on purpose), except those refused before the queue is looked at (a wrong
API key, a declared body over the limit). No answer may be a 5xx or a broken connection."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
WEATHER = {"type": "object", "properties": {"location": {"type": "string"},
                                            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["location"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
                                           "parameters": WEATHER}}]
ANSWER = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
          "required": ["answer"]}
HELLO = [{"role": "user", "content": "hi"}]
BAD_KINDS = ("json", "model", "field", "context", "too_large", "content_type", "key")
# Greedy: on a CPU, random sampling over the vocabulary is most of a step (n=2 samples are then alike, which
# still takes the fan-out path).
GREEDY = {"temperature": 0}
TOPICS = ["the sea", "a cat", "Paris", "prime numbers", "rain", "a red bicycle", "tea", "the moon"]


@dataclass
class Outcome:
    scenario: str
    status: int  # 0: no HTTP answer (the connection failed)
    problem: str | None = None


class Traffic:
    """Requests against one server; `max_body_bytes` is its body limit, `max_model_len` its context."""

    def __init__(self, client: httpx.AsyncClient, max_body_bytes: int, max_model_len: int) -> None:
        self.client = client
        self.max_body_bytes = max_body_bytes
        self.max_model_len = max_model_len
        self.scenarios: dict[str, Callable[[random.Random], Awaitable[list[Outcome]]]] = {
            "chat": self.chat, "chat_stream": self.chat_stream, "completion": self.completion,
            "completion_stream": self.completion_stream, "n2": self.n2, "logprobs": self.logprobs,
            "tool_call": self.tool_call, "structured": self.structured, "stop": self.stop,
            "disconnect": self.disconnect, "bad_request": self.bad_request,
        }

    async def chat(self, rng: random.Random) -> list[Outcome]:
        return [await self._json("chat", CHAT, self._chat_body(rng), lambda b: _message(b)["content"] is not None)]

    async def chat_stream(self, rng: random.Random) -> list[Outcome]:
        body = {**self._chat_body(rng), "stream": True, "stream_options": {"include_usage": True}}
        return [await self._stream("chat_stream", CHAT, body)]

    async def completion(self, rng: random.Random) -> list[Outcome]:
        body = {"prompt": f"A short note about {rng.choice(TOPICS)}:", "max_tokens": rng.randint(4, 16), **GREEDY}
        return [await self._json("completion", COMPLETIONS, body, lambda b: isinstance(b["choices"][0]["text"], str))]

    async def completion_stream(self, rng: random.Random) -> list[Outcome]:
        body = {"prompt": f"Once, {rng.choice(TOPICS)}", "max_tokens": rng.randint(4, 16), "stream": True, **GREEDY}
        return [await self._stream("completion_stream", COMPLETIONS, body)]

    async def n2(self, rng: random.Random) -> list[Outcome]:
        body = {**self._chat_body(rng), "n": 2}
        return [await self._json("n2", CHAT, body, lambda b: sorted(c["index"] for c in b["choices"]) == [0, 1])]

    async def logprobs(self, rng: random.Random) -> list[Outcome]:
        chat = {**self._chat_body(rng), "logprobs": True, "top_logprobs": 3}
        legacy = {"prompt": f"About {rng.choice(TOPICS)}", "max_tokens": 6, "logprobs": 2, "echo": rng.random() < 0.5,
                  **GREEDY}
        return [await self._json("logprobs", CHAT, chat, lambda b: len(b["choices"][0]["logprobs"]["content"]) > 0),
                await self._json("logprobs", COMPLETIONS, legacy,
                                 lambda b: len(b["choices"][0]["logprobs"]["tokens"]) > 0)]

    async def tool_call(self, rng: random.Random) -> list[Outcome]:
        choice = rng.choice(["required", {"type": "function", "function": {"name": "get_weather"}}])
        body = {"messages": [{"role": "user", "content": f"What's the weather in {rng.choice(['Paris', 'Oslo'])}?"}],
                "tools": TOOLS, "tool_choice": choice, "max_tokens": 48, **GREEDY}

        def valid(b: dict) -> bool:
            if b["choices"][0]["finish_reason"] == "length":
                return True  # cut short: the call is incomplete by request
            call = _message(b)["tool_calls"][0]["function"]
            return call["name"] == "get_weather" and "location" in json.loads(call["arguments"])

        return [await self._json("tool_call", CHAT, body, valid)]

    async def structured(self, rng: random.Random) -> list[Outcome]:
        body = {"messages": [{"role": "user", "content": f"Is {rng.choice(TOPICS)} blue? Answer in JSON."}],
                "max_tokens": 24, "response_format": {"type": "json_schema", "json_schema": {
                    "name": "answer", "schema": ANSWER}}, **GREEDY}

        def valid(b: dict) -> bool:
            choice = b["choices"][0]
            return choice["finish_reason"] == "length" or json.loads(choice["message"]["content"])["answer"] in (
                "yes", "no")

        return [await self._json("structured", CHAT, body, valid)]

    async def stop(self, rng: random.Random) -> list[Outcome]:
        stop = rng.choice([".", " the", "\n"])
        body = {"prompt": f"Write about {rng.choice(TOPICS)}.", "max_tokens": 24, "stop": [stop], **GREEDY}
        return [await self._json("stop", COMPLETIONS, body, lambda b: stop not in b["choices"][0]["text"])]

    async def disconnect(self, rng: random.Random) -> list[Outcome]:
        """A client that leaves mid-stream: the server must free what the request held."""
        body = {**self._chat_body(rng), "max_tokens": 64, "stream": True, "ignore_eos": True}
        try:
            async with self.client.stream("POST", CHAT, json=body) as response:
                if response.status_code != 200:
                    await response.aread()
                    return [_expect("disconnect", response.status_code, {429})]
                events = 0
                async for line in response.aiter_lines():
                    events += line.startswith("data:")
                    if events >= rng.randint(1, 3):
                        break
                return [Outcome("disconnect", 200)]
        except httpx.HTTPError as e:
            return [Outcome("disconnect", 0, f"{type(e).__name__}: {e}")]

    async def bad_request(self, rng: random.Random, kind: str | None = None) -> list[Outcome]:
        """One bad request of `kind` (one of BAD_KINDS; by default a random one)."""
        kind = kind or rng.choice(BAD_KINDS)
        headers: dict[str, str] = {}
        content: bytes | None = None
        body: dict | None = None
        path = rng.choice([CHAT, COMPLETIONS])
        expected = {400}
        if kind == "json":
            content = b'{"messages": [{"role": "user", "content": "hi"}'
        elif kind == "model":
            body, expected = {"model": "no-such-model", "prompt": "hi", "messages": HELLO}, {404}
        elif kind == "field":
            body = {"prompt": "hi", "messages": HELLO, "max_tokens": -3}
        elif kind == "context":  # more text than the context could hold in any tokens
            body = {"prompt": "x " * (self.max_model_len * 100), "messages": [
                {"role": "user", "content": "x " * (self.max_model_len * 100)}]}
        elif kind == "too_large":
            content, expected = b'{"prompt": "' + b"a" * (self.max_body_bytes + 1024) + b'"}', {413}
        elif kind == "content_type":
            content, expected = b"prompt=hi", {415}
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        else:
            body, expected = {"prompt": "hi"}, {401}
            headers["Authorization"] = "Bearer wrong-key"
        if content is not None:
            headers.setdefault("Content-Type", "application/json")
        try:
            response = await self.client.post(path, json=body, content=content, headers=headers)
        except httpx.HTTPError as e:
            if kind == "too_large":  # the server may close before the whole body is sent
                return [Outcome(f"bad_request:{kind}", 413)]
            return [Outcome(f"bad_request:{kind}", 0, f"{type(e).__name__}: {e}")]
        if kind not in ("key", "too_large"):  # refused on arrival, before the queue bound is looked at
            expected.add(429)
        outcome = _expect(f"bad_request:{kind}", response.status_code, expected)
        if outcome.problem is None and "error" not in response.json():
            outcome.problem = "an error status without an OpenAI error body"
        return [outcome]

    async def burst(self, size: int) -> list[Outcome]:
        """`size` small requests at once, past the queue bound: each gets 200 or 429."""
        async def one(i: int) -> Outcome:
            try:
                response = await self.client.post(COMPLETIONS, json={"prompt": f"Burst {i}", "max_tokens": 2,
                                                                     **GREEDY})
            except httpx.HTTPError as e:
                return Outcome("burst", 0, f"{type(e).__name__}: {e}")
            if response.status_code == 429 and not response.headers.get("retry-after", "").isdigit():
                return Outcome("burst", 429, "a 429 without Retry-After")
            return _expect("burst", response.status_code, set())

        return list(await asyncio.gather(*(one(i) for i in range(size))))

    def _chat_body(self, rng: random.Random) -> dict:
        return {"messages": [{"role": "user", "content": f"Say something about {rng.choice(TOPICS)}."}],
                "max_tokens": rng.randint(4, 16), **GREEDY}

    async def _json(self, scenario: str, path: str, body: dict, valid: Callable[[dict], bool]) -> Outcome:
        try:
            response = await self.client.post(path, json=body)
        except httpx.HTTPError as e:
            return Outcome(scenario, 0, f"{type(e).__name__}: {e}")
        outcome = _expect(scenario, response.status_code, set())
        if response.status_code == 200:
            try:
                if not valid(response.json()):
                    outcome.problem = f"an invalid answer: {response.text[:300]}"
            except (KeyError, IndexError, TypeError, ValueError) as e:
                outcome.problem = f"an invalid answer ({type(e).__name__}: {e}): {response.text[:300]}"
        return outcome

    async def _stream(self, scenario: str, path: str, body: dict) -> Outcome:
        try:
            async with self.client.stream("POST", path, json=body) as response:
                if response.status_code != 200:
                    await response.aread()
                    return _expect(scenario, response.status_code, set())
                events = [line[5:].strip() async for line in response.aiter_lines() if line.startswith("data:")]
        except httpx.HTTPError as e:
            return Outcome(scenario, 0, f"{type(e).__name__}: {e}")
        if not events or events[-1] != "[DONE]":
            return Outcome(scenario, 200, "the stream did not end with [DONE]")
        chunks = [json.loads(e) for e in events[:-1]]
        if any("error" in c for c in chunks):
            return Outcome(scenario, 200, f"an error event: {next(c for c in chunks if 'error' in c)}")
        if not any(choice.get("finish_reason") for c in chunks for choice in c.get("choices", [])):
            return Outcome(scenario, 200, "no finish_reason in the stream")
        return Outcome(scenario, 200)


def _message(body: dict) -> dict:
    return body["choices"][0]["message"]


def _expect(scenario: str, status: int, expected: set[int]) -> Outcome:
    """A generation request may always get 200 or 429; `expected` adds the statuses of a bad request."""
    allowed = expected or {200, 429}
    return Outcome(scenario, status, None if status in allowed else f"status {status}, expected one of "
                                                                    f"{sorted(allowed)}")
