"""merge_step_outputs: consecutive steps' outputs as one, against the steps themselves."""

from __future__ import annotations

from wick.engine.protocol import EngineCoreOutput, merge_step_outputs


def _lp(token: int) -> tuple[list[int], list[float], int]:
    return [token, token + 1], [-0.5, -1.5], 1


def test_each_requests_tokens_and_logprobs_in_order_once_with_the_latest_finish():
    steps = [
        [EngineCoreOutput("a", [1], [_lp(1)], num_cached_tokens=16), EngineCoreOutput("b", [], None, [_lp(9)])],
        [EngineCoreOutput("b", [5], None, [_lp(8)]), EngineCoreOutput("a", [2], [_lp(2)], num_cached_tokens=16)],
        [EngineCoreOutput("a", [3], [_lp(3)], finish_reason="stop", stop_reason=3, num_cached_tokens=16),
         EngineCoreOutput("c", [7])],
    ]
    merged = merge_step_outputs(steps)
    assert [o.request_id for o in merged] == ["a", "b", "c"]
    a, b, c = merged
    assert (a.new_token_ids, a.new_logprobs) == ([1, 2, 3], [_lp(1), _lp(2), _lp(3)])
    assert (a.finish_reason, a.stop_reason, a.num_cached_tokens) == ("stop", 3, 16)
    assert (b.new_token_ids, b.new_logprobs, b.new_prompt_logprobs) == ([5], None, [_lp(9), _lp(8)])
    assert (b.finish_reason, c.new_token_ids) == (None, [7])
    # the steps themselves are left as they were
    assert steps[0][0].new_token_ids == [1] and steps[0][0].new_logprobs == [_lp(1)]


def test_an_output_after_a_finish_stays_apart():
    """An id used again after its request finished (or an embedding's output) is not folded into the old one."""
    steps = [[EngineCoreOutput("a", [1], finish_reason="length")], [EngineCoreOutput("a", [4])],
             [EngineCoreOutput("e", [], finish_reason="stop", pooling_output=[0.5])], [EngineCoreOutput("e", [])]]
    merged = merge_step_outputs(steps)
    assert [(o.request_id, o.new_token_ids, o.finish_reason) for o in merged] == [
        ("a", [1], "length"), ("a", [4], None), ("e", [], "stop"), ("e", [], None)]
