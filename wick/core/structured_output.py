"""Structured output: grammar-constrained decoding with xgrammar, inside the engine core.

The manager compiles each constrained request's grammar (compiled grammars are cached by their
spec) and gives the request a `RequestGrammar`, its own matcher. Each step, the model runner asks
for the token bitmask of the rows that sample (one bit per token of the model's vocabulary, 1 =
allowed); the scheduler advances the matcher with every token it appends and stops the request
once the matcher has accepted a stop token.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedTokenizerBase

from wick.config import EngineConfig
from wick.core.request import Request
from wick.core.sched_output import GrammarBitmask
from wick.sampling_params import StructuredOutputsParams
from wick.tokenizer.tokenizer import get_tokenizer

if TYPE_CHECKING:
    import xgrammar as xgr

logger = logging.getLogger(__name__)

_CACHE_SIZE = 256


class RequestGrammar:
    """One request's matcher. It tracks how many output tokens it has accepted, so that feeding it
    the output again (after a preemption, say) never advances it twice over the same token. With an
    `after_token_id`, it is inactive (the output free) until that token is in the output."""

    def __init__(self, matcher: xgr.GrammarMatcher, after_token_id: int | None = None) -> None:
        self.matcher = matcher
        self.after_token_id = after_token_id
        self.active = after_token_id is None
        self.num_accepted = 0  # output tokens seen: before activation, those searched for the token

    def advance(self, output_token_ids: list[int]) -> bool:
        """Accepts the output tokens not accepted yet; True once the grammar has ended."""
        if not self.active:
            new = output_token_ids[self.num_accepted:]
            if self.after_token_id not in new:
                self.num_accepted = len(output_token_ids)
                return False
            self.num_accepted += new.index(self.after_token_id) + 1
            self.active = True
        for token in output_token_ids[self.num_accepted:]:
            self.num_accepted += 1
            if not self.matcher.accept_token(token):
                # Only possible when something outside the mask chose the token (a sampler bug).
                logger.warning("the grammar rejected token %d; stopping the request", token)
                return True
        return self.matcher.is_terminated()

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, row)


class StructuredOutputManager:
    """Imports xgrammar, loads the tokenizer and builds xgrammar's view of the vocabulary on the
    first constrained request, so that engines that never see one pay nothing."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        # The model's vocabulary may be padded past the tokenizer's; xgrammar masks the extra rows.
        self.vocab_size = config.hf_config.vocab_size
        self._compiler: xgr.GrammarCompiler | None = None
        self._cache: OrderedDict[tuple[str, str], xgr.CompiledGrammar] = OrderedDict()
        self._bitmask = torch.empty((config.max_num_seqs, -(-self.vocab_size // 32)), dtype=torch.int32,
                                    pin_memory=config.device.type == "cuda")

    def init_request(self, request: Request) -> None:
        """Gives a constrained request its matcher; raises ValueError for a grammar that does not compile."""
        spec = request.sampling_params.structured_outputs
        if spec is None:
            return
        import xgrammar as xgr

        stop_ids = request.sampling_params.eos_token_ids or None
        request.structured_output = RequestGrammar(
            xgr.GrammarMatcher(self._compiled(spec), override_stop_tokens=stop_ids), spec.after_token_id)

    @staticmethod
    def any_active(requests: list[Request]) -> bool:
        """Whether a grammar holds the next token of any of `requests`."""
        return any(r.structured_output is not None and r.structured_output.active for r in requests)

    def fill_bitmask(self, requests: list[Request]) -> GrammarBitmask | None:
        """The masks of the constrained requests among `requests` (those that sample this step), in a
        buffer reused every step; None when none is constrained (yet)."""
        constrained = [request for request in requests
                       if request.structured_output is not None and request.structured_output.active]
        if not constrained:
            return None
        bitmask = self._bitmask[:len(constrained)]
        for i, request in enumerate(constrained):
            request.structured_output.fill(bitmask, i)
        return GrammarBitmask([request.request_id for request in constrained], bitmask)

    def _compiled(self, spec: StructuredOutputsParams) -> xgr.CompiledGrammar:
        key = _cache_key(spec)
        compiled = self._cache.get(key)
        if compiled is not None:
            self._cache.move_to_end(key)
            return compiled
        compiler = self._get_compiler()
        kind, text = key
        try:
            if kind == "json":
                compiled = compiler.compile_json_schema(text, any_whitespace=False)
            elif kind == "regex":
                compiled = compiler.compile_regex(text)
            else:
                compiled = compiler.compile_grammar(text)
        except RuntimeError as e:
            raise ValueError(f"structured_outputs: cannot compile the {kind}: {e}") from None
        self._cache[key] = compiled
        if len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)
        return compiled

    def _get_compiler(self) -> xgr.GrammarCompiler:
        if self._compiler is None:
            import xgrammar as xgr

            info = xgr.TokenizerInfo.from_huggingface(self._load_tokenizer(), vocab_size=self.vocab_size)
            # Our own cache keeps the compiled grammars; xgrammar's would hold a second copy.
            self._compiler = xgr.GrammarCompiler(info, cache_enabled=False)
        return self._compiler

    def _load_tokenizer(self) -> PreTrainedTokenizerBase:
        source = self.config.source
        if source.kind == "dummy" and not source.tokenizer_path:
            raise ValueError("structured output needs a tokenizer, and this model was loaded without one")
        return get_tokenizer(source.tokenizer_path or source.path, gguf_file=source.gguf_file,
                             trust_remote_code=self.config.args.trust_remote_code)


def _cache_key(spec: StructuredOutputsParams) -> tuple[str, str]:
    """(kind, text): a JSON schema, a regex, or an EBNF grammar, which is how choices compile."""
    if spec.json is not None:
        return "json", json.dumps(spec.json)
    if spec.json_object:
        return "json", '{"type": "object"}'
    if spec.regex is not None:
        return "regex", spec.regex
    if spec.choice is not None:
        # JSON string literals are valid EBNF string literals, escapes included.
        return "grammar", "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in spec.choice)
    return "grammar", spec.grammar
