"""The fused exponential race against the sampler's torch path: the same hash bits, the same draws and
the same sampled tokens."""

from __future__ import annotations

import random

import pytest
import torch

import wick.kernels.sampling as sampling
from wick.kernels.sampling import exponential_race, exponential_race_ref, random_draws
from wick.layers.sampler import (
    _GOLDEN,
    _M32,
    _mix32,
    _sample_random,
    random_exponentials,
)
from wick.sampling_params import SamplingParams
from wick.worker.input_batch import CachedRequestState, build_sampling_metadata

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EDGE_SEEDS = [0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, -(2**63), -1, -(2**32), 0x0123_4567_89AB_CDEF]


def torch_bits(seeds: torch.Tensor, steps: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The hash bits inside wick.layers.sampler.random_exponentials, step by step in torch."""
    low, high = seeds & _M32, (seeds >> 32) & _M32
    key = _mix32((low + _mix32((high + _GOLDEN) & _M32)) & _M32)
    key = _mix32(key ^ _mix32((steps + 2 * _GOLDEN) & _M32))
    tokens = _mix32((torch.arange(vocab_size, device=seeds.device) + 3 * _GOLDEN) & _M32)
    return _mix32(key[:, None] ^ tokens[None, :])


def random_seeds(n: int, rng: random.Random) -> torch.Tensor:
    return torch.tensor([rng.randrange(-(2**63), 2**63) for _ in range(n)], dtype=torch.int64, device=DEVICE)


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Several tiles per chunk and several chunks per row even at the small shapes the interpreter runs."""
    monkeypatch.setattr(sampling, "_BLOCK", 128)
    monkeypatch.setattr(sampling, "_TARGET_PROGRAMS", 8)


def test_bits_and_exponentials_match_torch() -> None:
    rng = random.Random(0)
    seeds = torch.cat([torch.tensor(EDGE_SEEDS, device=DEVICE), random_seeds(21, rng)])
    steps = torch.tensor([rng.choice([0, 1, 4095, 2**31, 2**32 + 5, 2**40]) for _ in seeds], device=DEVICE)
    vocab_size = 1000 + 37
    bits, exponentials = random_draws(seeds, steps, vocab_size)
    expected_bits = torch_bits(seeds, steps, vocab_size)
    assert torch.equal(bits, expected_bits)
    expected = random_exponentials(seeds, steps, vocab_size)
    # The helper above is the sampler's hash: its bits give exactly the sampler's exponentials.
    assert torch.equal(-torch.log(((expected_bits >> 8) | 1).float() * 2.0**-24), expected)
    # fp32 log: numpy (interpreter) or libdevice (GPU) against torch's, each within an ulp of the truth.
    torch.testing.assert_close(exponentials, expected, rtol=3e-7, atol=0)


@pytest.mark.parametrize("vocab_size", [1, 127, 1000, 2053])
def test_race_matches_reference(vocab_size: int, small_chunks: None) -> None:
    rng = random.Random(vocab_size)
    generator = torch.Generator(device=DEVICE).manual_seed(vocab_size)
    for trial in range(8):
        num_rows = 3 if trial else len(EDGE_SEEDS)
        seeds = torch.tensor(EDGE_SEEDS, device=DEVICE) if trial == 0 else random_seeds(num_rows, rng)
        steps = torch.randint(0, 2**33, (num_rows,), device=DEVICE, generator=generator)
        scale = torch.rand(num_rows, 1, device=DEVICE, generator=generator) * 8
        probs = (torch.randn(num_rows, vocab_size, device=DEVICE, generator=generator) * scale).softmax(-1)
        # top-k/min-p leave zeros
        probs = probs.masked_fill(probs < probs.median(-1, keepdim=True).values, 0.0)
        assert torch.equal(exponential_race(probs, seeds, steps), exponential_race_ref(probs, seeds, steps))


def test_sampler_torch_path_matches_kernel() -> None:
    """The CPU sampler's exponential race and the kernel draw the same tokens over many seeds and steps,
    with seeds anywhere in the 64-bit range the requests carry."""
    rng = random.Random(1)
    vocab_size = 1000
    for _ in range(12):
        sp = SamplingParams(temperature=rng.uniform(0.3, 2.0))
        num_outputs = rng.randrange(5)
        requests = [CachedRequestState(f"r{i}", [1, 2, 3], [1, 2, 3] + [rng.randrange(vocab_size)
                                       for _ in range(num_outputs)], sp, rng.randrange(2**64), 0)
                    for i in range(3)]
        metadata = build_sampling_metadata(requests, vocab_size, torch.device("cpu"))
        logits = torch.randn(3, vocab_size) * 4
        probs = (logits / metadata.temperature[:, None]).softmax(-1)
        expected = _sample_random(logits, metadata)
        got = exponential_race(probs.to(DEVICE), metadata.seeds.to(DEVICE), metadata.steps.to(DEVICE))
        assert torch.equal(got.cpu(), expected)


def test_ties_take_the_lowest_token(small_chunks: None) -> None:
    """Tokens whose p / E are exactly equal (p = E * 2**-10): in one lane across tiles, across lanes
    and across chunks (blocks of 128 tokens, chunks of 384 here)."""
    seeds = torch.tensor([7, -7, 2**40], device=DEVICE)
    steps = torch.tensor([0, 3, 9], device=DEVICE)
    vocab_size = 1000
    _, exponentials = random_draws(seeds, steps, vocab_size)
    probs = torch.zeros(3, vocab_size, device=DEVICE)
    tied = torch.tensor([[2, 130, 999], [41, 40, 998], [501, 5, 760]], device=DEVICE)
    probs.scatter_(1, tied, exponentials.gather(1, tied) * 2.0**-10)
    assert exponential_race(probs, seeds, steps).tolist() == [2, 40, 5]


def test_nan_rows_pick_the_first_nan_like_torch(small_chunks: None) -> None:
    seeds, steps = torch.tensor([1, 2, 3], device=DEVICE), torch.zeros(3, dtype=torch.int64, device=DEVICE)
    probs = torch.rand(3, 300, device=DEVICE)
    probs[0] = float("nan")
    probs[1, [77, 250]] = float("nan")
    expected = exponential_race_ref(probs, seeds, steps)
    assert expected.tolist()[:2] == [0, 77]
    assert torch.equal(exponential_race(probs, seeds, steps), expected)


def test_empty_batch() -> None:
    empty = torch.empty(0, dtype=torch.int64, device=DEVICE)
    assert exponential_race(torch.empty(0, 50, device=DEVICE), empty, empty).shape == (0,)


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@requires_cuda
def test_race_matches_torch_cuda() -> None:
    """Qwen-sized vocabulary, batch 256: the same token in every row but near-ties, where the fp32 logs
    of the two paths may order the top two scores differently."""
    num_rows, vocab_size = 256, 151936
    generator = torch.Generator(device="cuda").manual_seed(0)
    scale = torch.rand(num_rows, 1, device="cuda", generator=generator) * 10
    probs = (torch.randn(num_rows, vocab_size, device="cuda", generator=generator) * scale).softmax(-1)
    seeds = torch.randint(-(2**63), 2**63 - 1, (num_rows,), device="cuda", generator=generator)
    steps = torch.randint(0, 2**20, (num_rows,), device="cuda", generator=generator)
    got = exponential_race(probs, seeds, steps)
    expected = exponential_race_ref(probs, seeds, steps)
    scores = probs / random_exponentials(seeds, steps, vocab_size)
    top2 = scores.topk(2, dim=-1).values
    near_tie = (top2[:, 0] - top2[:, 1]) <= 1e-6 * top2[:, 0]
    assert torch.equal(got[~near_tie], expected[~near_tie])
    assert torch.all(scores.gather(1, got[:, None])[:, 0] >= top2[:, 1])
    bits, exponentials = random_draws(seeds[:8], steps[:8], vocab_size)
    assert torch.equal(bits, torch_bits(seeds[:8], steps[:8], vocab_size))
    torch.testing.assert_close(exponentials, random_exponentials(seeds[:8], steps[:8], vocab_size), rtol=3e-7, atol=0)


@pytest.mark.gpu
@requires_cuda
def test_race_in_cuda_graph() -> None:
    num_rows, vocab_size = 64, 151936
    probs = torch.randn(num_rows, vocab_size, device="cuda").softmax(-1)
    seeds = torch.zeros(num_rows, dtype=torch.int64, device="cuda")
    steps = torch.zeros_like(seeds)
    exponential_race(probs, seeds, steps)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = exponential_race(probs, seeds, steps)
    for step in range(3):
        seeds.copy_(torch.randint(-(2**63), 2**63 - 1, (num_rows,), device="cuda"))
        steps.fill_(step)
        graph.replay()
        assert torch.equal(out, exponential_race(probs, seeds, steps))
