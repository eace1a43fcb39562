"""The front end's half of a request: incremental detokenization, stop strings, logprobs as text,
and the n samples of one request gathered into one RequestOutput."""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from wick.engine.protocol import EngineCoreOutput, TokenLogprobs
from wick.engine.stop_strings import StopStringMatcher
from wick.outputs import CompletionOutput, Logprob, PositionLogprobs, RequestOutput
from wick.sampling_params import SamplingParams
from wick.tokenizer.detokenizer import IncrementalDetokenizer


@dataclass
class _Sample:
    parent: _RequestState
    output: CompletionOutput
    detokenizer: IncrementalDetokenizer | None  # None: a model without a tokenizer gives no text
    stop: StopStringMatcher


@dataclass
class _RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    samples: list[_Sample] = field(default_factory=list)
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    num_cached_tokens: int = 0

    @property
    def finished(self) -> bool:
        if len(self.samples) == 1:
            return self.samples[0].output.finished
        return all(s.output.finished for s in self.samples)


def _one_token_each(out: EngineCoreOutput) -> list[EngineCoreOutput]:
    """An output of several new tokens as one output per token, in order; the finish comes with the last."""
    last = len(out.new_token_ids) - 1
    return [EngineCoreOutput(out.request_id, [token], out.new_logprobs[i:i + 1] if out.new_logprobs else None,
                             None, out.finish_reason if i == last else None, out.stop_reason if i == last else None,
                             out.num_cached_tokens)
            for i, token in enumerate(out.new_token_ids)]


def child_request_id(request_id: str, index: int, n: int) -> str:
    return request_id if n == 1 else f"{index}_{request_id}"


def child_seed(seed: int | None, index: int) -> int | None:
    """The seed of sample `index` of a request with n > 1: distinct per sample, reproducible."""
    return None if seed is None else (seed + index * 0x9E3779B97F4A7C15) % 2**63


class OutputProcessor:
    def __init__(self, tokenizer: PreTrainedTokenizerBase | None) -> None:
        self.tokenizer = tokenizer
        self._requests: dict[str, _RequestState] = {}
        self._samples: dict[str, _Sample] = {}

    def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                    params: SamplingParams) -> list[str]:
        """Registers a request; returns the ids of its n samples as the engine core knows them."""
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        state = _RequestState(request_id, prompt, prompt_token_ids, params,
                              prompt_logprobs=[None] if params.prompt_logprobs is not None else None)
        child_ids = [child_request_id(request_id, i, params.n) for i in range(params.n)]
        for i, child_id in enumerate(child_ids):
            sample = _Sample(
                state,
                CompletionOutput(i, logprobs=[] if params.logprobs is not None else None,
                                 cumulative_logprob=0.0 if params.logprobs is not None else None),
                IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params.skip_special_tokens,
                                       params.spaces_between_special_tokens) if self.tokenizer else None,
                StopStringMatcher(params.stop, params.include_stop_str_in_output))
            state.samples.append(sample)
            self._samples[child_id] = sample
        self._requests[request_id] = state
        return child_ids

    def abort_request(self, request_id: str) -> list[str]:
        """Forgets a request; returns the child ids the core still has to abort."""
        state = self._requests.pop(request_id, None)
        if state is None:
            return []
        child_ids = [child_request_id(request_id, i, state.params.n) for i in range(state.params.n)]
        for child_id in child_ids:
            self._samples.pop(child_id, None)
        return child_ids

    def process_outputs(self, outputs: list[EngineCoreOutput]) -> tuple[list[RequestOutput], list[str]]:
        """Returns the RequestOutputs that changed and the child ids to abort in the core
        (samples that hit a stop string)."""
        changed: dict[str, _RequestState] = {}
        to_abort: list[str] = []
        for out in outputs:
            sample = self._samples.get(out.request_id)
            if sample is None:
                continue
            state = sample.parent
            changed[state.request_id] = state
            state.num_cached_tokens = max(state.num_cached_tokens, out.num_cached_tokens)
            if out.new_prompt_logprobs and state.prompt_logprobs is not None and sample.output.index == 0:
                state.prompt_logprobs.extend(self._position_logprobs(e) for e in out.new_prompt_logprobs)
            # A stop string ends a sample at the token that completes it, also among several new tokens.
            parts = _one_token_each(out) if sample.stop.stop and len(out.new_token_ids) > 1 else (out,)
            if any([self._advance(sample, part) for part in parts]):
                to_abort.append(out.request_id)
        results = []
        for state in changed.values():
            results.append(self._request_output(state))
            if state.finished:
                self.abort_request(state.request_id)
        return results, to_abort

    def _advance(self, sample: _Sample, out: EngineCoreOutput) -> bool:
        """Adds the new tokens to a sample; True when a stop string ended it before the core did."""
        output = sample.output
        if output.finished:
            return False
        output.token_ids.extend(out.new_token_ids)
        if out.new_logprobs and output.logprobs is not None:
            for entry in out.new_logprobs:
                output.logprobs.append(self._position_logprobs(entry))
                output.cumulative_logprob += entry[1][0]
        delta = ""
        if sample.detokenizer is not None:
            delta = sample.detokenizer.add_tokens(self._text_token_ids(sample.parent.params, out))
            if out.finish_reason is not None:
                delta += sample.detokenizer.flush()
        text, matched = sample.stop.feed(delta)
        if matched is not None:
            output.text += text
            output.finish_reason, output.stop_reason = "stop", matched
            return out.finish_reason is None
        if out.finish_reason is not None:
            text += sample.stop.flush()
            output.finish_reason, output.stop_reason = out.finish_reason, out.stop_reason
        output.text += text
        return False

    @staticmethod
    def _text_token_ids(params: SamplingParams, out: EngineCoreOutput) -> list[int]:
        """The new tokens that make text: an end-of-sequence or stop token that ended the request has none
        (it shows when special tokens are kept), unless include_stop_str_in_output asks for it."""
        token_ids = out.new_token_ids
        if (out.finish_reason == "stop" and token_ids and not params.include_stop_str_in_output
                and (token_ids[-1] in params.eos_token_ids or token_ids[-1] in params.stop_token_ids)):
            return token_ids[:-1]
        return token_ids

    def _position_logprobs(self, entry: TokenLogprobs) -> PositionLogprobs:
        ids, logprobs, rank = entry
        result: PositionLogprobs = {}
        for i, (token_id, logprob) in enumerate(zip(ids, logprobs, strict=True)):
            if token_id not in result:
                result[token_id] = Logprob(logprob, rank if i == 0 else i,
                                           self.tokenizer.decode([token_id]) if self.tokenizer else None)
        return result

    def _request_output(self, state: _RequestState) -> RequestOutput:
        return RequestOutput(
            state.request_id, state.prompt, state.prompt_token_ids,
            [s.output for s in state.samples], state.finished,
            state.prompt_logprobs, state.num_cached_tokens)
