"""OutputProcessor: several tokens of a request in one output (a receiver that caught up) give what the same
tokens give one step at a time, stop strings included."""

from __future__ import annotations

import pytest

from wick.engine.output_processor import OutputProcessor
from wick.engine.protocol import EngineCoreOutput
from wick.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer):
    return smollm2_tokenizer


def _run(tokenizer, params: SamplingParams, token_ids: list[int], chunk: int) -> tuple[list, list[str]]:
    processor = OutputProcessor(tokenizer)
    processor.add_request("r", None, [1, 2, 3], params)
    seen, aborted = [], []
    for start in range(0, len(token_ids), chunk):
        last = start + chunk >= len(token_ids)
        out = EngineCoreOutput("r", token_ids[start:start + chunk],
                               finish_reason="length" if last else None, num_cached_tokens=0)
        outputs, to_abort = processor.process_outputs([out])
        seen += outputs
        aborted += to_abort
    return seen, aborted


@pytest.mark.parametrize("stop", [[], ["capital"], [" of Fr"]])
def test_tokens_in_one_output_match_one_a_step(tokenizer, stop):
    token_ids = tokenizer.encode("The capital of France is Paris, and the capital of Spain is Madrid.")
    params = SamplingParams(max_tokens=len(token_ids), stop=stop)
    step_by_step, aborted_one = _run(tokenizer, params, token_ids, 1)
    final_one = next(o for o in step_by_step if o.finished).outputs[0]
    for chunk in (3, len(token_ids)):
        outputs, aborted = _run(tokenizer, params, token_ids, chunk)
        final = next(o for o in outputs if o.finished).outputs[0]
        assert (final.text, final.token_ids, final.finish_reason, final.stop_reason) == (
            final_one.text, final_one.token_ids, final_one.finish_reason, final_one.stop_reason)
        assert aborted == aborted_one
    if stop:
        assert final_one.finish_reason == "stop" and final_one.stop_reason == stop[0]
        assert len(final_one.token_ids) < len(token_ids) and aborted_one == ["r"]
    else:
        assert final_one.text == tokenizer.decode(token_ids, skip_special_tokens=True)
