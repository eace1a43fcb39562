"""The OpenAI API's request bodies as pydantic models (vLLM's extra sampling fields included), and
their mapping onto SamplingParams. Unknown fields are ignored, as OpenAI's own server does."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

from wick.sampling_defaults import SamplingDefaults
from wick.sampling_params import SamplingParams, StructuredOutputsParams

# Bounds that keep absurd values out before they reach the engine.
MAX_N = 128
MAX_STOP_STRINGS = 64
MAX_LOGPROBS = 20


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class StreamOptions(OpenAIModel):
    include_usage: StrictBool = False


class TextPart(OpenAIModel):
    type: Literal["text"]
    text: str


class FunctionCall(OpenAIModel):
    name: str
    arguments: str | dict[str, Any] = ""


class ToolCall(OpenAIModel):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(OpenAIModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class JsonSchemaFormat(OpenAIModel):
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(OpenAIModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("json_schema is needed when type is 'json_schema'")
        return self


class NamedFunction(OpenAIModel):
    name: str


class NamedToolChoice(OpenAIModel):
    type: Literal["function"] = "function"
    function: NamedFunction


class SamplingRequest(OpenAIModel):
    """The fields chat and completion requests share."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # vLLM's extra sampling fields.
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    min_tokens: int = Field(default=0, ge=0)
    ignore_eos: StrictBool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: StrictBool = True
    spaces_between_special_tokens: StrictBool = True
    include_stop_str_in_output: StrictBool = False
    # Structured output: OpenAI's response_format and vLLM's fields (at most one of them).
    response_format: ResponseFormat | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: dict[str, Any] | None = None

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and len(stop) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed")
        return stop

    @field_validator("logit_bias")
    @classmethod
    def _check_logit_bias(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        for token, value in (bias or {}).items():
            if not token.isdigit():
                raise ValueError(f"keys must be token ids, got {token!r}")
            if not -100.0 <= value <= 100.0:
                raise ValueError(f"values must be in [-100, 100], got {value} for token {token}")
        return bias

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def sampling_params(self, max_tokens: int, logprobs: int | None, prompt_logprobs: int | None = None,
                        structured_outputs: StructuredOutputsParams | None = None,
                        defaults: SamplingDefaults | None = None) -> SamplingParams:
        """Raises ValueError (naming the field) for settings SamplingParams refuses. A field the request
        leaves out takes its value from `defaults` (the model's generation config and the server's flags)."""
        pick = (defaults or SamplingDefaults()).pick
        return SamplingParams(
            n=self.n, temperature=pick("temperature", self.temperature), top_p=pick("top_p", self.top_p),
            top_k=pick("top_k", self.top_k), min_p=pick("min_p", self.min_p),
            presence_penalty=pick("presence_penalty", self.presence_penalty),
            frequency_penalty=pick("frequency_penalty", self.frequency_penalty),
            repetition_penalty=pick("repetition_penalty", self.repetition_penalty),
            seed=self.seed, max_tokens=max_tokens, min_tokens=self.min_tokens, stop=self.stop,
            stop_token_ids=self.stop_token_ids, ignore_eos=self.ignore_eos, logprobs=logprobs,
            prompt_logprobs=prompt_logprobs, skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            logit_bias={int(token): value for token, value in self.logit_bias.items()} if self.logit_bias else None,
            structured_outputs=structured_outputs)


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: StrictBool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool = True
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False

    @model_validator(mode="after")
    def _check_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs to be true")
        return self

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def template_messages(self) -> list[dict[str, Any]]:
        return template_messages(self.messages)


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as chat templates read them: tool-call arguments as objects, not JSON text, and a null
    content (an assistant's tool calls) as empty text, which every template can read."""
    result = []
    for message in messages:
        entry = message.model_dump(exclude_none=True)
        entry.setdefault("content", "")
        for call in entry.get("tool_calls", []):
            arguments = call["function"]["arguments"]
            if isinstance(arguments, str):
                try:
                    parsed = json.loads(arguments)
                except ValueError:
                    continue
                if isinstance(parsed, dict):
                    call["function"]["arguments"] = parsed
        result.append(entry)
    return result


# A completion prompt: text, texts, token ids, or lists of token ids.
PromptInput = str | list[str] | list[int] | list[list[int]]


def _prompt_input(prompt: Any) -> PromptInput:
    def is_ids(value: Any) -> bool:
        return isinstance(value, list) and bool(value) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in value)

    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt) or is_ids(prompt) or all(is_ids(p) for p in prompt):
            return prompt
    raise ValueError("must be a string, a non-empty list of strings, a non-empty list of token ids, "
                     "or a list of non-empty token-id lists")


class CompletionRequest(SamplingRequest):
    prompt: Any
    echo: StrictBool = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    @field_validator("prompt")
    @classmethod
    def _check_prompt(cls, prompt: Any) -> PromptInput:
        return _prompt_input(prompt)

    def prompts(self) -> list[str | list[int]]:
        prompt = self.prompt
        if isinstance(prompt, str) or isinstance(prompt[0], int):
            return [prompt]
        return list(prompt)


class TokenizeRequest(OpenAIModel):
    """Either `prompt` (completion style) or `messages` (chat style)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: StrictBool = True
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt and messages")
        if self.messages is not None and not self.messages:
            raise ValueError("messages must not be empty")
        return self


class DetokenizeRequest(OpenAIModel):
    model: str | None = None
    tokens: list[int]


# Inputs per embeddings request, as OpenAI bounds them.
MAX_EMBEDDING_INPUTS = 2048


def _embedding_input(value: Any) -> str | list[str] | list[int] | list[list[int]]:
    def is_ids(item: Any) -> bool:
        return isinstance(item, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in item)

    if isinstance(value, str):
        if not value:
            raise ValueError("must not be empty")
        return value
    if not isinstance(value, list) or not value:
        raise ValueError("must be a non-empty string, list of strings, list of token ids, or list of token-id lists")
    if len(value) > MAX_EMBEDDING_INPUTS:
        raise ValueError(f"at most {MAX_EMBEDDING_INPUTS} inputs are allowed, got {len(value)}")
    if all(isinstance(item, str) for item in value):
        if not all(value):
            raise ValueError("must not hold an empty string")
        return value
    if is_ids(value) or (all(is_ids(item) for item in value)):
        if not all(value):
            raise ValueError("must not hold an empty list of token ids")
        return value
    raise ValueError("must be a non-empty string, list of strings, list of token ids, or list of token-id lists")


class EmbeddingRequest(OpenAIModel):
    """OpenAI's embeddings request, and vLLM's extra fields truncate_prompt_tokens and normalize."""

    model: str | None = None
    input: Any
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    normalize: StrictBool | None = None

    @field_validator("input")
    @classmethod
    def _check_input(cls, value: Any) -> str | list[str] | list[int] | list[list[int]]:
        return _embedding_input(value)

    def inputs(self) -> list[str | list[int]]:
        value = self.input
        if isinstance(value, str) or isinstance(value[0], int):
            return [value]
        return list(value)
