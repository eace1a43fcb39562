"""Which requests a decode graph's own draw covers (SamplingRow.plain)."""

from __future__ import annotations

import pytest

from wick.sampling_params import SamplingParams
from wick.worker.input_batch import CachedRequestState


def _row(**settings):
    return CachedRequestState("r", [1, 2], [1, 2], SamplingParams(**settings), 0, 0).sampling_row


@pytest.mark.parametrize("settings", [{}, {"temperature": 0.0}, {"temperature": 0.7, "seed": 3},
                                      {"temperature": 0.0, "top_k": 5, "top_p": 0.5, "min_p": 0.1},
                                      {"max_tokens": 4, "stop_token_ids": [7]}])
def test_plain(settings):
    assert _row(**settings).plain


@pytest.mark.parametrize("settings", [{"top_k": 5}, {"top_p": 0.9}, {"min_p": 0.1}, {"presence_penalty": 0.5},
                                      {"frequency_penalty": -0.5}, {"repetition_penalty": 1.1}, {"logprobs": 0},
                                      {"logit_bias": {3: 1.0}}, {"min_tokens": 2},
                                      {"temperature": 0.0, "presence_penalty": 0.5}])
def test_not_plain(settings):
    assert not _row(**settings).plain
