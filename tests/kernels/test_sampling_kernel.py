"""The fused draw (greedy argmax or exponential race, from logits in their dtype) against the sampler's torch path:
the same hash bits, the same draws and the same sampled tokens."""

from __future__ import annotations

import random

import pytest
import torch

import wick.kernels.sampling as sampling
from wick.kernels.sampling import exponential_race, random_draws
from wick.layers.sampler import (
    _GOLDEN,
    _M32,
    Sampler,
    _mix32,
    exponential_race_torch,
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


def random_logits(num_rows: int, vocab_size: int, generator: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """Logits of varied spread, with -inf where filters (top-k, top-p, min-p) would leave it."""
    scale = torch.rand(num_rows, 1, device=DEVICE, generator=generator) * 8
    logits = torch.randn(num_rows, vocab_size, device=DEVICE, generator=generator) * scale
    logits = logits.masked_fill(logits < logits.median(-1, keepdim=True).values, float("-inf"))
    return logits.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab_size", [1, 127, 1000, 2053])
def test_race_matches_reference(vocab_size: int, dtype: torch.dtype, small_chunks: None) -> None:
    rng = random.Random(vocab_size)
    generator = torch.Generator(device=DEVICE).manual_seed(vocab_size)
    for trial in range(8):
        num_rows = 3 if trial else len(EDGE_SEEDS)
        seeds = torch.tensor(EDGE_SEEDS, device=DEVICE) if trial == 0 else random_seeds(num_rows, rng)
        steps = torch.randint(0, 2**33, (num_rows,), device=DEVICE, generator=generator)
        # greedy rows (0 and below the threshold) among random ones
        temperature = torch.tensor([rng.choice([0.0, 5e-6, 0.3, 1.0, 1.7]) for _ in range(num_rows)], device=DEVICE)
        logits = random_logits(num_rows, vocab_size, generator, dtype)
        expected = exponential_race_torch(logits, temperature, seeds, steps)
        assert torch.equal(exponential_race(logits, temperature, seeds, steps), expected)


def test_sampler_torch_path_matches_kernel() -> None:
    """The CPU sampler and the kernel draw the same tokens over many seeds, steps and temperatures, with seeds
    anywhere in the 64-bit range the requests carry."""
    rng = random.Random(1)
    vocab_size = 1000
    for _ in range(12):
        requests = [CachedRequestState(f"r{i}", [1, 2, 3], [1, 2, 3] + [rng.randrange(vocab_size)
                                       for _ in range(rng.randrange(5))],
                                       SamplingParams(temperature=rng.choice([0.0, rng.uniform(0.3, 2.0)])),
                                       rng.randrange(2**64), 0)
                    for i in range(3)]
        metadata = build_sampling_metadata(requests, vocab_size, torch.device("cpu"))
        logits = torch.randn(3, vocab_size) * 4
        expected = Sampler()(logits, metadata).sampled_token_ids
        got = exponential_race(logits.to(DEVICE), metadata.temperature.to(DEVICE), metadata.seeds.to(DEVICE),
                               metadata.steps.to(DEVICE))
        assert torch.equal(got.cpu(), expected)


def test_ties_take_the_lowest_token(small_chunks: None) -> None:
    """Greedy rows whose largest logit repeats: in one lane across tiles, across lanes and across chunks
    (blocks of 128 tokens, chunks of 384 here)."""
    seeds, steps = torch.tensor([7, -7, 2**40], device=DEVICE), torch.tensor([0, 3, 9], device=DEVICE)
    logits = torch.zeros(3, 1000, device=DEVICE, dtype=torch.bfloat16)
    tied = torch.tensor([[2, 130, 999], [41, 40, 998], [501, 5, 760]], device=DEVICE)
    logits.scatter_(1, tied, 3.0)
    assert exponential_race(logits, torch.zeros(3, device=DEVICE), seeds, steps).tolist() == [2, 40, 5]


def test_nan_rows_pick_the_first_nan_like_torch(small_chunks: None) -> None:
    seeds, steps = torch.tensor([1, 2, 3], device=DEVICE), torch.zeros(3, dtype=torch.int64, device=DEVICE)
    logits = torch.randn(3, 300, device=DEVICE)
    logits[0] = float("nan")
    logits[1, [77, 250]] = float("nan")
    for temperature in (torch.zeros(3, device=DEVICE), torch.ones(3, device=DEVICE)):
        expected = exponential_race_torch(logits, temperature, seeds, steps)
        assert expected.tolist()[:2] == [0, 77]
        assert torch.equal(exponential_race(logits, temperature, seeds, steps), expected)


def test_empty_batch() -> None:
    empty = torch.empty(0, dtype=torch.int64, device=DEVICE)
    logits, temperature = torch.empty(0, 50, device=DEVICE), torch.empty(0, device=DEVICE)
    assert exponential_race(logits, temperature, empty, empty).shape == (0,)


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@requires_cuda
def test_race_matches_torch_cuda() -> None:
    """Qwen-sized vocabulary, batch 256, bf16 logits, a quarter of the rows greedy: the same token in every row
    but near-ties, where the fp32 logs of the two paths may order the top two scores differently."""
    num_rows, vocab_size = 256, 151936
    generator = torch.Generator(device="cuda").manual_seed(0)
    scale = torch.rand(num_rows, 1, device="cuda", generator=generator) * 10
    logits = (torch.randn(num_rows, vocab_size, device="cuda", generator=generator) * scale).bfloat16()
    temperature = torch.rand(num_rows, device="cuda", generator=generator) * 2
    temperature[::4] = 0.0
    seeds = torch.randint(-(2**63), 2**63 - 1, (num_rows,), device="cuda", generator=generator)
    steps = torch.randint(0, 2**20, (num_rows,), device="cuda", generator=generator)
    got = exponential_race(logits, temperature, seeds, steps)
    expected = exponential_race_torch(logits, temperature, seeds, steps)
    scores = logits.float() / temperature[:, None] - random_exponentials(seeds, steps, vocab_size).log()
    scores[::4] = logits[::4].float()
    top2 = scores.topk(2, dim=-1).values
    near_tie = (top2[:, 0] - top2[:, 1]) <= 1e-5 * top2[:, 0].abs().clamp(min=1.0)
    near_tie[::4] = False
    assert torch.equal(got[~near_tie], expected[~near_tie])
    assert torch.all(scores.gather(1, got[:, None])[:, 0] >= top2[:, 1])
    bits, exponentials = random_draws(seeds[:8], steps[:8], vocab_size)
    assert torch.equal(bits, torch_bits(seeds[:8], steps[:8], vocab_size))
    torch.testing.assert_close(exponentials, random_exponentials(seeds[:8], steps[:8], vocab_size), rtol=3e-7, atol=0)


@pytest.mark.gpu
@requires_cuda
def test_race_in_cuda_graph() -> None:
    num_rows, vocab_size = 64, 151936
    logits = torch.randn(num_rows, vocab_size, device="cuda").bfloat16()
    temperature = torch.ones(num_rows, device="cuda")
    seeds = torch.zeros(num_rows, dtype=torch.int64, device="cuda")
    steps = torch.zeros_like(seeds)
    exponential_race(logits, temperature, seeds, steps)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = exponential_race(logits, temperature, seeds, steps)
    for step in range(3):
        seeds.copy_(torch.randint(-(2**63), 2**63 - 1, (num_rows,), device="cuda"))
        steps.fill_(step)
        temperature[: 8 * step] = 0.0
        graph.replay()
        assert torch.equal(out, exponential_race(logits, temperature, seeds, steps))
