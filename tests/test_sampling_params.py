import pytest

from wick import SamplingParams


@pytest.mark.parametrize("field,value", [
    ("n", 0), ("temperature", -0.1), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -2), ("min_p", 1.2),
    ("presence_penalty", 2.5), ("frequency_penalty", -3.0), ("repetition_penalty", 0.0), ("max_tokens", 0),
    ("min_tokens", -1), ("logprobs", 21), ("prompt_logprobs", -1), ("stop", [""]), ("stop_token_ids", [-3]),
])
def test_out_of_range_values_are_rejected_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_defaults_and_normalisation():
    params = SamplingParams(stop="###", top_k=-1, temperature=0.0)
    assert params.stop == ["###"] and params.top_k == 0 and params.greedy
    assert SamplingParams(min_tokens=5, max_tokens=5).min_tokens == 5
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=6, max_tokens=5)
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={3: 101.0})


def test_clone_revalidates():
    params = SamplingParams(n=3, seed=1)
    assert params.clone(n=1).n == 1 and params.n == 3
    with pytest.raises(ValueError):
        params.clone(top_p=0.0)
