"""The batched sampler against plain-Python references of each step."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from wick.core.sched_output import GrammarBitmask
from wick.layers.sampler import (
    Sampler,
    SamplerOutput,
    SamplingMetadata,
    compute_prompt_logprobs,
    process_logits,
)
from wick.sampling_params import SamplingParams
from wick.worker.input_batch import CachedRequestState, build_sampling_metadata

CPU = torch.device("cpu")


def make_request(sp: SamplingParams, seed: int = 0, prompt: tuple[int, ...] = (1, 2, 3),
                 output: tuple[int, ...] = (), rid: str = "r") -> CachedRequestState:
    return CachedRequestState(rid, list(prompt), list(prompt) + list(output), sp, seed, 0)


def metadata_for(requests: list[CachedRequestState], vocab_size: int) -> SamplingMetadata:
    return build_sampling_metadata(requests, vocab_size, CPU)


def sample(requests: list[CachedRequestState], logits: torch.Tensor) -> SamplerOutput:
    return Sampler()(logits, metadata_for(requests, logits.shape[-1]))


def chi_square(samples: torch.Tensor, probs: list[float]) -> float:
    counts = torch.bincount(samples, minlength=len(probs)).tolist()
    n = len(samples)
    return sum((c - n * p) ** 2 / (n * p) for c, p in zip(counts, probs, strict=True) if p > 0)


def softmax(values: list[float]) -> list[float]:
    top = max(values)
    exps = [math.exp(v - top) for v in values]
    return [e / sum(exps) for e in exps]


def test_greedy_is_argmax() -> None:
    torch.manual_seed(0)
    logits = torch.randn(5, 50)
    requests = [make_request(SamplingParams(temperature=0.0, top_k=3, top_p=0.5), seed=s) for s in range(5)]
    out = sample(requests, logits)
    assert out.sampled_token_ids.dtype == torch.int64
    assert torch.equal(out.sampled_token_ids, logits.argmax(-1))
    assert out.logprobs is None


def test_seeded_token_is_the_same_alone_in_a_batch_and_after_preemption() -> None:
    torch.manual_seed(1)
    vocab = 40
    target_row = torch.randn(vocab)
    others = [
        make_request(SamplingParams(temperature=0.0), seed=7, rid="greedy"),
        make_request(SamplingParams(presence_penalty=1.0, repetition_penalty=1.3), seed=8, output=(3, 3),
                     rid="penalized"),
        make_request(SamplingParams(top_p=0.5, min_p=0.1, logprobs=2), seed=9, rid="nucleus"),
    ]
    tokens = set()
    for seed in [0, 1, 2**32, 2**63 - 1, -(2**63), 2**64 - 5, 123456789]:
        sp = SamplingParams(temperature=0.9, top_k=20)
        alone = sample([make_request(sp, seed=seed, output=(4, 5))], target_row[None]).sampled_token_ids
        batch_logits = torch.randn(4, vocab)
        batch_logits[2] = target_row
        batch = [others[0], others[1], make_request(sp, seed=seed, output=(4, 5)), others[2]]
        in_batch = sample(batch, batch_logits).sampled_token_ids[2]
        # Preempted and recomputed: a new Request object with the same seed and the same outputs.
        resumed = make_request(sp, seed=seed, output=(4, 5), rid="again")
        again = sample([others[2], resumed], torch.stack([batch_logits[3], target_row])).sampled_token_ids[1]
        assert alone.item() == in_batch.item() == again.item()
        tokens.add(alone.item())
    assert len(tokens) > 1


def test_samples_over_seeds_follow_softmax_of_scaled_logits() -> None:
    logits = [2.0, 1.0, 0.5, 0.0, -1.0, -0.5]
    temperature = 0.7
    expected = softmax([x / temperature for x in logits])
    n = 6000
    requests = [make_request(SamplingParams(temperature=temperature), seed=s) for s in range(n)]
    out = sample(requests, torch.tensor([logits] * n))
    # df = 5: P(chi2 > 30) < 2e-5 for a correct sampler.
    assert chi_square(out.sampled_token_ids, expected) < 30.0


def test_samples_over_steps_and_high_seed_bits_follow_softmax() -> None:
    logits = [0.3, -0.2, 1.1, 0.0, 0.7]
    expected = softmax(logits)
    n = 6000
    requests = [make_request(SamplingParams(), seed=42)] * n
    metadata = metadata_for(requests, len(logits))
    by_step = dataclasses.replace(metadata, steps=torch.arange(n))
    out = Sampler()(torch.tensor([logits] * n), by_step)
    assert chi_square(out.sampled_token_ids, expected) < 30.0
    # Seeds that differ only in their upper 32 bits must still give independent draws.
    by_high_bits = dataclasses.replace(metadata, seeds=torch.arange(n) << 32)
    out = Sampler()(torch.tensor([logits] * n), by_high_bits)
    assert chi_square(out.sampled_token_ids, expected) < 30.0


def reference_allowed(logits: list[float], temperature: float, top_k: int, top_p: float,
                      min_p: float) -> dict[int, float]:
    """Allowed tokens and their renormalized probabilities, by the definitions in plain Python."""
    scaled = [x / temperature for x in logits]
    order = sorted(range(len(scaled)), key=lambda i: -scaled[i])
    kept = order[:top_k] if top_k else order
    probs = dict(zip(kept, softmax([scaled[i] for i in kept]), strict=True))
    if top_p < 1.0:
        nucleus, mass = [], 0.0
        for i in kept:
            if mass >= top_p:
                break
            nucleus.append(i)
            mass += probs[i]
        kept = nucleus
    if min_p > 0.0:
        kept = [i for i in kept if probs[i] >= min_p * probs[kept[0]]]
    total = sum(probs[i] for i in kept)
    return {i: probs[i] / total for i in kept}


@pytest.mark.parametrize(("temperature", "top_k", "top_p", "min_p"), [
    (1.0, 3, 1.0, 0.0),
    (1.3, 0, 0.6, 0.0),
    (0.8, 0, 1.0, 0.2),
    (1.5, 6, 0.8, 0.05),
    (1.0, 1, 1.0, 0.0),
])
def test_filters_never_sample_a_filtered_token(temperature: float, top_k: int, top_p: float,
                                               min_p: float) -> None:
    torch.manual_seed(top_k * 100 + int(top_p * 10))
    vocab, n = 16, 3000
    row = torch.randn(vocab) * 2
    allowed = reference_allowed(row.tolist(), temperature, top_k, top_p, min_p)
    sp = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    requests = [make_request(sp, seed=s) for s in range(n)]
    sampled = sample(requests, row.expand(n, vocab).clone()).sampled_token_ids
    assert set(sampled.tolist()) <= set(allowed)
    expected = [allowed.get(i, 0.0) for i in range(vocab)]
    assert chi_square(sampled, expected) < 40.0


def reference_penalized(logits: list[float], prompt: list[int], output: list[int],
                        sp: SamplingParams) -> list[float]:
    result = []
    for token, value in enumerate(logits):
        count = output.count(token)
        if token in prompt or count > 0:
            r = sp.repetition_penalty
            value = value / r if value > 0 else value * r
        value -= sp.frequency_penalty * count + sp.presence_penalty * (count > 0)
        result.append(value)
    return result


def test_penalties_match_the_openai_and_hf_definitions() -> None:
    torch.manual_seed(3)
    vocab = 12
    cases = [
        (SamplingParams(temperature=0.0, presence_penalty=0.5, frequency_penalty=0.3), (1, 2), (2, 2, 5)),
        (SamplingParams(temperature=0.0, frequency_penalty=-0.7), (0,), (11, 4, 4, 4)),
        (SamplingParams(temperature=0.0, repetition_penalty=1.5), (1, 6, 7), (6, 9)),
        (SamplingParams(temperature=0.0, repetition_penalty=0.8, presence_penalty=-1.0), (3,), (3, 8)),
        (SamplingParams(temperature=0.0), (1, 2, 3), (1, 2, 3)),
    ]
    requests = [make_request(sp, seed=i, prompt=p, output=o) for i, (sp, p, o) in enumerate(cases)]
    logits = torch.randn(len(cases), vocab) * 3
    metadata = metadata_for(requests, vocab)
    got = process_logits(logits, metadata)
    expected = torch.tensor([reference_penalized(logits[i].tolist(), list(p), list(o), sp)
                             for i, (sp, p, o) in enumerate(cases)])
    torch.testing.assert_close(got, expected)
    assert torch.equal(Sampler()(logits, metadata).sampled_token_ids, expected.argmax(-1))


def test_metadata_leaves_out_what_no_request_uses() -> None:
    plain = metadata_for([make_request(SamplingParams(temperature=0.0), output=(1,))], 8)
    assert plain.output_counts is None and plain.prompt_mask is None and plain.bias_rows is None
    assert plain.suppress_rows is None and plain.max_num_logprobs is None
    assert plain.all_greedy
    presence = metadata_for([make_request(SamplingParams(presence_penalty=1.0), output=(1, 1))], 8)
    assert presence.prompt_mask is None and presence.output_counts[0, 1] == 2
    assert not presence.all_greedy and presence.no_top_k and presence.no_top_p and presence.no_min_p
    # Seeds beyond int64 fold onto the int64 with the same low 64 bits.
    folded = metadata_for([make_request(SamplingParams(), seed=seed) for seed in (2**64 - 1, 2**63)], 8)
    assert folded.seeds.tolist() == [-1, -(2**63)]


def test_logprobs_are_raw_log_softmax_with_topk() -> None:
    torch.manual_seed(4)
    vocab = 30
    logits = torch.randn(3, vocab)
    requests = [
        make_request(SamplingParams(temperature=0.8, logprobs=3, presence_penalty=2.0,
                                    logit_bias={0: 5.0}), seed=1, output=(2, 7)),
        make_request(SamplingParams(temperature=1.0), seed=2),
        make_request(SamplingParams(temperature=0.0, logprobs=1), seed=3),
    ]
    out = sample(requests, logits)
    assert out.logprobs is not None
    raw = torch.log_softmax(logits, dim=-1)
    sampled = out.sampled_token_ids
    assert out.logprobs.token_ids.shape == out.logprobs.logprobs.shape == (3, 4)
    assert torch.equal(out.logprobs.token_ids[:, 0], sampled)
    torch.testing.assert_close(out.logprobs.logprobs[:, 0], raw.gather(1, sampled[:, None])[:, 0])
    top_values, top_ids = torch.topk(raw, 3, dim=-1)
    assert torch.equal(out.logprobs.token_ids[:, 1:], top_ids)
    torch.testing.assert_close(out.logprobs.logprobs[:, 1:], top_values)
    expected_ranks = [int((raw[i] > raw[i, t]).sum()) + 1 for i, t in enumerate(sampled.tolist())]
    assert out.logprobs.ranks.tolist() == expected_ranks
    assert out.logprobs.ranks[2] == 1


def test_zero_logprobs_gives_only_the_sampled_token() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    out = sample([make_request(SamplingParams(temperature=0.0, logprobs=0))], logits)
    assert out.logprobs is not None
    assert out.logprobs.token_ids.tolist() == [[1]]
    assert out.logprobs.ranks.tolist() == [1]


def test_min_tokens_blocks_eos_and_stop_ids() -> None:
    vocab, eos, stop = 10, 7, 9
    logits = torch.zeros(vocab)
    logits[eos], logits[stop], logits[4] = 10.0, 9.0, 1.0

    def params(**kw: object) -> SamplingParams:
        return SamplingParams(min_tokens=3, eos_token_ids=[eos], stop_token_ids=[stop], **kw)

    early = make_request(params(temperature=0.0), output=(1,))
    done = make_request(params(temperature=0.0), output=(1, 2, 3))
    ignoring = make_request(params(temperature=0.0, ignore_eos=True), output=(1,))
    assert sample([early, done, ignoring], logits.expand(3, vocab).clone()).sampled_token_ids.tolist() == [
        4, eos, eos]
    n = 500
    requests = [make_request(params(temperature=1.0), seed=s, output=(1, 2)) for s in range(n)]
    sampled = set(sample(requests, logits.expand(n, vocab).clone()).sampled_token_ids.tolist())
    assert not sampled & {eos, stop}


def test_logit_bias_shifts_the_logits() -> None:
    logits = torch.tensor([[3.0, 2.0, 0.0, 1.0, 0.5, -1.0]] * 3)
    requests = [
        make_request(SamplingParams(temperature=0.0, logit_bias={5: 100.0})),
        make_request(SamplingParams(temperature=0.0, logit_bias={0: -100.0})),
        make_request(SamplingParams(temperature=0.0)),
    ]
    assert sample(requests, logits).sampled_token_ids.tolist() == [5, 1, 0]
    n = 200
    biased = [make_request(SamplingParams(logit_bias={0: -100.0, 1: -100.0}), seed=s) for s in range(n)]
    assert not set(sample(biased, logits[:1].expand(n, 6).clone()).sampled_token_ids.tolist()) & {0, 1}
    with pytest.raises(ValueError, match="outside the vocabulary"):
        metadata_for([make_request(SamplingParams(logit_bias={6: 1.0}))], 6)


def test_prompt_logprobs_gather_log_softmax_at_targets() -> None:
    torch.manual_seed(5)
    logits = torch.randn(5, 20)
    targets = torch.tensor([3, 0, 19, 7, 7])
    result = compute_prompt_logprobs(logits, targets, 4)
    raw = torch.log_softmax(logits, dim=-1)
    assert torch.equal(result.token_ids[:, 0], targets)
    torch.testing.assert_close(result.logprobs[:, 0], raw[torch.arange(5), targets])
    top_values, top_ids = torch.topk(raw, 4, dim=-1)
    assert torch.equal(result.token_ids[:, 1:], top_ids)
    torch.testing.assert_close(result.logprobs[:, 1:], top_values)
    expected_ranks = [int((raw[i] > raw[i, t]).sum()) + 1 for i, t in enumerate(targets.tolist())]
    assert result.ranks.tolist() == expected_ranks


def _pack(allowed: list[list[int]], vocab_size: int) -> torch.Tensor:
    """xgrammar's layout: bit t % 32 of int32 word t // 32 allows token t."""
    words = torch.zeros(len(allowed), -(-vocab_size // 32), dtype=torch.int64)
    for row, tokens in enumerate(allowed):
        for t in tokens:
            words[row, t // 32] |= 1 << (t % 32)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def test_grammar_bitmask_constrains_only_its_rows_greedy_and_random() -> None:
    torch.manual_seed(6)
    vocab_size = 70  # not a multiple of 32: the last word's high bits lie past the vocabulary
    logits = torch.randn(4, vocab_size)
    allowed = [[1, 31, 32, 69], [5]]
    requests = [make_request(SamplingParams(temperature=t, repetition_penalty=1.2, top_k=3), seed=s, output=(1,),
                             rid=str(s)) for s, t in enumerate([0.0, 1.0, 0.0, 1.0])]
    # Listed in another order than the batch's rows: the masks follow the request ids.
    grammar = GrammarBitmask(["3", "0"], _pack(allowed[::-1], vocab_size))
    metadata = build_sampling_metadata(requests, vocab_size, CPU, grammar)
    processed = process_logits(logits, metadata)
    free = process_logits(logits, metadata_for(requests, vocab_size))
    for row, tokens in zip([0, 3], allowed, strict=True):
        assert torch.isfinite(processed[row]).nonzero().flatten().tolist() == tokens
    assert torch.equal(processed[1:3], free[1:3])

    sampled = Sampler()(logits, metadata).sampled_token_ids.tolist()
    assert sampled[0] == max(allowed[0], key=lambda t: free[0, t].item())
    assert sampled[3] == 5
    assert sampled[1:3] == sample(requests, logits).sampled_token_ids.tolist()[1:3]

    many = [make_request(SamplingParams(temperature=1.5), seed=s, rid=str(s)) for s in range(200)]
    mask = GrammarBitmask([str(s) for s in range(200)], _pack(allowed[:1] * 200, vocab_size))
    draws = Sampler()(logits[:1].expand(200, vocab_size).clone(), build_sampling_metadata(many, vocab_size, CPU, mask))
    assert set(draws.sampled_token_ids.tolist()) <= set(allowed[0])
