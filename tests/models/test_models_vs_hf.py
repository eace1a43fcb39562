"""Every architecture: greedy tokens and logits through our paged path match HF transformers (CPU, fp32)."""

from __future__ import annotations

import pytest
import torch
from hf_configs import build_pair, hf_configs, prompts
from paged_generate import PagedRunner, Sequence
from transformers import PretrainedConfig

CONFIGS = hf_configs()
NEW_TOKENS = 32


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request: pytest.FixtureRequest) -> tuple[torch.nn.Module, torch.nn.Module, PretrainedConfig]:
    config = CONFIGS[request.param]
    return (*build_pair(config), config)


def test_greedy_matches_hf(pair: tuple[torch.nn.Module, torch.nn.Module, PretrainedConfig]) -> None:
    hf, ours, config = pair
    ps = prompts(config.vocab_size)
    results = PagedRunner(ours, block_size=4).generate(ps, NEW_TOKENS)
    for prompt, (tokens, logits) in zip(ps, results, strict=True):
        with torch.no_grad():
            out = hf.generate(
                torch.tensor([prompt]),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
            )
        assert tokens == out.sequences[0, len(prompt) :].tolist()
        hf_logits = torch.cat(out.logits)
        top2 = hf_logits.topk(2).values
        clear = (top2[:, 0] - top2[:, 1] > 1e-3).float().mean()
        assert clear > 0.9, "greedy near-ties at most steps make the token check meaningless"
        torch.testing.assert_close(logits, hf_logits, atol=1e-4, rtol=1e-4)


def test_prompt_logprobs_match_hf(pair: tuple[torch.nn.Module, torch.nn.Module, PretrainedConfig]) -> None:
    hf, ours, config = pair
    prompt = prompts(config.vocab_size)[-1]
    logits = PagedRunner(ours).step([(Sequence(list(prompt)), len(prompt))])[0]
    with torch.no_grad():
        hf_logits = hf(torch.tensor([prompt])).logits[0]
    targets = torch.tensor(prompt[1:])[:, None]
    ours_lp = logits[:-1].log_softmax(-1).gather(1, targets)
    hf_lp = hf_logits[:-1].log_softmax(-1).gather(1, targets)
    torch.testing.assert_close(ours_lp, hf_lp, atol=1e-3, rtol=0)


def test_chunked_prefill_matches_one_shot(pair: tuple[torch.nn.Module, torch.nn.Module, PretrainedConfig]) -> None:
    _, ours, config = pair
    prompt = prompts(config.vocab_size)[-1] + prompts(config.vocab_size)[-2]
    one_shot = PagedRunner(ours).step([(Sequence(list(prompt)), len(prompt))])[0]
    runner, seq = PagedRunner(ours, seed=1), Sequence(list(prompt))
    chunks = [runner.step([(seq, n)])[0] for n in (5, 1, 9, 8, len(prompt) - 23)]
    torch.testing.assert_close(torch.cat(chunks), one_shot, atol=1e-4, rtol=1e-4)


def test_mixed_batch_matches_each_alone(pair: tuple[torch.nn.Module, torch.nn.Module, PretrainedConfig]) -> None:
    _, ours, config = pair
    ps = prompts(config.vocab_size)

    def run(runner: PagedRunner, seqs: list[Sequence], batched: bool) -> list[torch.Tensor]:
        # step 1: the first two prefill; step 2: they decode while the others prefill (one in two chunks)
        steps = [
            [(seqs[0], len(ps[0])), (seqs[1], len(ps[1]))],
            [(seqs[0], 1), (seqs[2], len(ps[2])), (seqs[1], 1), (seqs[3], 10)],
            [(seqs[3], len(ps[3]) - 10), (seqs[2], 1), (seqs[0], 1)],
        ]
        out = []
        for work in steps:
            for seq, _ in work:
                seq.token_ids.append(5)
            out += runner.step(work) if batched else [runner.step([w])[0] for w in work]
        return out

    batched = run(PagedRunner(ours), [Sequence(list(p)) for p in ps], batched=True)
    alone = run(PagedRunner(ours, seed=2), [Sequence(list(p)) for p in ps], batched=False)
    for a, b in zip(batched, alone, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(torch.cuda.is_available(), reason="interprets Triton on CPU tensors, which must be chosen before "
                    "the kernels' modules load; on CUDA tests/models/test_families_engine.py runs the Triton backend")
@pytest.mark.parametrize("name", ["llama3", "qwen3", "gemma3", "phi3_longrope"])
def test_triton_backend_matches_torch_backend(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the Triton backend the layers write the KV cache themselves (in the rotary kernel on CUDA; here,
    its kernels in Triton's interpreter, after the torch rotation): the same tokens and logits as the torch backend."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from wick.layers.attention.triton_backend import TritonAttentionBackend

    config = CONFIGS[name]
    _, ours = build_pair(config)
    ps = prompts(config.vocab_size)[:2]
    expected = PagedRunner(ours).generate(ps, 4)
    results = PagedRunner(ours, backend=TritonAttentionBackend()).generate(ps, 4)
    for (tokens, logits), (expected_tokens, expected_logits) in zip(results, expected, strict=True):
        assert tokens == expected_tokens
        torch.testing.assert_close(logits, expected_logits, atol=1e-4, rtol=1e-4)
