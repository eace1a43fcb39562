"""The offline API, shaped like vLLM's: LLM(model=...).generate(...) / .chat(...) / .embed(...)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from wick.config import EngineArgs
from wick.engine.core import EngineCore
from wick.engine.output_processor import OutputProcessor, child_seed
from wick.engine.protocol import EngineCoreRequest
from wick.outputs import EmbeddingOutput, EmbeddingRequestOutput, RequestOutput
from wick.pooling_params import PoolingParams
from wick.sampling_defaults import SamplingDefaults
from wick.sampling_params import SamplingParams
from wick.tokenizer.chat_template import apply_chat_template
from wick.tokenizer.embedding_inputs import tokenize_for_embedding
from wick.tokenizer.tokenizer import eos_token_ids, get_tokenizer
from wick.tools.chat_output import ChatOutputParser, tool_call_params
from wick.tools.tool_choice import forced_call, resolve_tool_parser

PromptType = str | list[int] | dict[str, Any]


class LLM:
    """An engine core in this process. `model=None` loads the default model (SmolLM2-135M-Instruct)."""

    def __init__(self, model: str | None = None, *, tool_call_parser: str | None = None, **kwargs: Any) -> None:
        """`tool_call_parser`: the tool-call format chat() parses (default: the one the chat template implies)."""
        self.engine_args = EngineArgs(model=model, **kwargs)
        self.tool_call_parser = tool_call_parser
        self.config = self.engine_args.create_engine_config()
        source = self.config.source
        # A dummy model from a preset has no tokenizer: it takes and returns token ids only.
        self.tokenizer: PreTrainedTokenizerBase | None = None
        self.eos_token_ids: list[int] = []
        if source.kind != "dummy" or source.tokenizer_path:
            self.tokenizer = get_tokenizer(source.tokenizer_path or source.path, gguf_file=source.gguf_file,
                                           trust_remote_code=self.engine_args.trust_remote_code)
            self.eos_token_ids = eos_token_ids(self.tokenizer, self.config.hf_config)
        self.sampling_defaults = SamplingDefaults.resolve(source, self.engine_args.generation_config,
                                                          self.engine_args.override_generation_config)
        self.core = EngineCore(self.config)
        self.output_processor = OutputProcessor(self.tokenizer)
        self._ids = itertools.count()

    def get_tokenizer(self) -> PreTrainedTokenizerBase:
        if self.tokenizer is None:
            raise ValueError("this model was loaded without a tokenizer: pass prompts as token ids")
        return self.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """The settings of a call that passes none: the model's generation config and the overrides, and
        max_tokens 16 (SamplingParams' own, as vLLM's) unless they set one."""
        defaults = self.sampling_defaults
        return defaults.sampling_params(defaults.max_tokens or SamplingParams().max_tokens)

    def generate(self, prompts: PromptType | Sequence[PromptType],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Prompts are strings, token-id lists, or dicts with "prompt" or "prompt_token_ids"."""
        if isinstance(prompts, str | dict) or (isinstance(prompts, list) and prompts
                                               and isinstance(prompts[0], int)):
            prompts = [prompts]
        encoded = [self._encode(p) for p in prompts]
        return self._run(encoded, sampling_params, use_tqdm)

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool = False, chat_template: str | None = None, add_generation_prompt: bool = True,
             continue_final_message: bool = False, tools: list[dict] | None = None,
             chat_template_kwargs: dict[str, Any] | None = None,
             tool_choice: str | dict[str, Any] = "auto") -> list[RequestOutput]:
        """With tools, each output's tool calls are parsed into `tool_calls` and its text is the content left.
        `tool_choice` "required" or {"type": "function", "function": {"name": ...}} guarantees a valid call."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        tokenizer = self.get_tokenizer()
        chat_template = chat_template or self.engine_args.chat_template
        encoded = []
        for conversation in conversations:
            text = apply_chat_template(
                tokenizer, conversation, add_generation_prompt=add_generation_prompt, tools=tools,
                chat_template=chat_template, continue_final_message=continue_final_message,
                **(chat_template_kwargs or {}))
            encoded.append((text, tokenizer.encode(text, add_special_tokens=False)))
        if not tools or tool_choice == "none":
            return self._run(encoded, sampling_params, use_tqdm)
        forced = forced_call(tools, tool_choice)
        parser = ChatOutputParser(tools=resolve_tool_parser(self.tool_call_parser, tokenizer, chat_template),
                                  forced=forced)
        params = sampling_params if sampling_params is not None else self.get_default_sampling_params()
        params = tool_call_params(params, parser, forced) if isinstance(params, SamplingParams) \
            else [tool_call_params(p, parser, forced) for p in params]
        results = self._run(encoded, params, use_tqdm)
        for result in results:
            for output in result.outputs:
                parts = parser.extract(output.text)
                output.text, output.tool_calls = parts.content or "", parts.tool_calls
        return results

    def embed(self, prompts: PromptType | Sequence[PromptType],
              pooling_params: PoolingParams | Sequence[PoolingParams] | None = None, *,
              truncate_prompt_tokens: int | None = None, use_tqdm: bool = False) -> list[EmbeddingRequestOutput]:
        """One embedding per prompt (strings, token-id lists, or dicts with "prompt" or "prompt_token_ids"), for an
        embedding model. `truncate_prompt_tokens` k keeps a text's first k tokens (its special tokens kept, as
        sentence-transformers truncates) and a token-id prompt's last k; -1 means the model's maximum length.
        Without it a prompt longer than the model's maximum length is a ValueError."""
        pooler = self.config.pooler_config
        if pooler is None:
            raise ValueError("this model generates text: embed() needs an embedding model (task='embed')")
        if isinstance(prompts, str | dict) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = (list(pooling_params) if isinstance(pooling_params, Sequence)
                  else [pooling_params or PoolingParams()] * len(prompts))
        if len(params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} PoolingParams")
        for p in params:
            pooler.check(p)
        inputs = [(p["prompt_token_ids"] if "prompt_token_ids" in p else p["prompt"]) if isinstance(p, dict) else p
                  for p in prompts]
        token_ids = tokenize_for_embedding(self.tokenizer, inputs, self.config.max_model_len, truncate_prompt_tokens)
        order: list[str] = []
        try:
            for ids, p in zip(token_ids, params, strict=True):
                order.append(str(next(self._ids)))
                self.core.add_request(EngineCoreRequest(order[-1], ids, SamplingParams(max_tokens=1), pooling_params=p))
            embeddings: dict[str, list[float]] = {}
            progress = tqdm(total=len(order), desc="Embedding", disable=not use_tqdm)
            while self.core.has_unfinished_requests():
                for output in self.core.step():
                    if output.pooling_output is not None:
                        embeddings[output.request_id] = output.pooling_output
                        progress.update(1)
            progress.close()
        except BaseException:
            self.core.abort_requests(order)
            raise
        return [EmbeddingRequestOutput(rid, EmbeddingOutput(embeddings[rid]), ids)
                for rid, ids in zip(order, token_ids, strict=True)]

    def _encode(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            prompt = prompt["prompt"]
        if isinstance(prompt, str):
            return prompt, self.get_tokenizer().encode(prompt)
        return None, list(prompt)

    def _run(self, prompts: list[tuple[str | None, list[int]]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None,
             use_tqdm: bool) -> list[RequestOutput]:
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        params = ([sampling_params] * len(prompts) if isinstance(sampling_params, SamplingParams)
                  else list(sampling_params))
        if len(params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} SamplingParams")
        order: list[str] = []
        try:
            for (text, token_ids), sp in zip(prompts, params, strict=True):
                order.append(self._add_request(text, token_ids, sp))
            return self._run_engine(order, use_tqdm)
        except BaseException:
            for request_id in order:
                self.core.abort_requests(self.output_processor.abort_request(request_id))
            raise

    def _add_request(self, prompt: str | None, token_ids: list[int], params: SamplingParams) -> str:
        request_id = str(next(self._ids))
        params = params.clone(eos_token_ids=self.eos_token_ids)
        child_ids = self.output_processor.add_request(request_id, prompt, token_ids, params)
        child_params = params.clone(n=1) if params.n > 1 else params
        for i, child_id in enumerate(child_ids):
            self.core.add_request(EngineCoreRequest(child_id, token_ids, child_params, child_seed(params.seed, i),
                                                    prefill_leader=child_ids[0] if i else None))
        return request_id

    def _run_engine(self, order: list[str], use_tqdm: bool) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        progress = tqdm(total=len(order), desc="Generating", disable=not use_tqdm)
        while self.core.has_unfinished_requests():
            outputs, to_abort = self.output_processor.process_outputs(self.core.step())
            if to_abort:
                self.core.abort_requests(to_abort)
            for output in outputs:
                if output.finished:
                    finished[output.request_id] = output
                    progress.update(1)
        progress.close()
        return [finished[request_id] for request_id in order]
