"""The all-reduce fused with the residual add and RMSNorm (kernels/all_reduce_rms_norm.py) against an all-reduce
followed by kernels/rms_norm.py's fused_add_rms_norm: on two GPUs against NCCL's, one call at a time, hundreds of
calls in a row with no wait between them (each call's rows overwrite the last one's), and replayed in a CUDA graph;
and on one GPU, two or four ranks as streams. Every rank gets the same bits."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from wick.distributed.parallel_state import init_distributed
from wick.distributed.symm_all_reduce import SymmAllReduce, symm_all_reduce
from wick.kernels.all_reduce_rms_norm import FLAGS_PER_RANK, all_reduce_rms_norm, reset_flags
from wick.kernels.rms_norm import fused_add_rms_norm

pytestmark = pytest.mark.gpu

WORLD = 2
HIDDEN = 4096
EPS = 1e-5
# decode steps of 1 to 128 rows (128 x 4096 bf16 is the one-shot limit of two ranks): a program owns the rows of
# its index modulo the programs' count, so more rows give a program more of them
ROWS = [1, 3, 16, 128, 1, 7, 64, 2]


def _randn(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    generator = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, generator=generator, device="cuda").to(torch.bfloat16)


def _reference(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    total = x.clone()
    dist.all_reduce(total)
    return fused_add_rms_norm(total, residual.clone(), weight, EPS)


def _assert_norm_close(out: torch.Tensor, expected: torch.Tensor) -> None:
    """The norms agree but where the variance, summed in another order than kernels/rms_norm.py's (its programs'
    warps differ), tips a rounding: an ulp of bf16 in a few elements (35 of 65,536 in one call of 50 seen on an
    H200, four ranks)."""
    torch.testing.assert_close(out, expected, atol=1e-2, rtol=1e-2)


def _same_on_every_rank(t: torch.Tensor) -> bool:
    parts = [torch.empty_like(t) for _ in range(WORLD)]
    dist.all_gather(parts, t)
    return all(torch.equal(p, parts[0]) for p in parts)


def _check_one(one_shot: SymmAllReduce, rank: int, rows: int, seed: int, weight: torch.Tensor) -> None:
    x = _randn((rows, HIDDEN), seed * WORLD + rank)
    residual = _randn((rows, HIDDEN), seed)
    expected_out, expected_residual = _reference(x, residual, weight)
    fused = one_shot.add_rms_norm(x, residual, weight, EPS)
    assert fused is not None
    out, new_residual = fused
    assert new_residual is residual  # in place, as fused_add_rms_norm's
    assert torch.equal(new_residual, expected_residual), f"{rows} rows: residual"
    _assert_norm_close(out, expected_out)
    assert _same_on_every_rank(out), f"{rows} rows: the ranks' norms differ"


def _check(rank: int, init_method: str) -> None:
    os.environ["WICK_FUSED_ALL_REDUCE_NORM"] = "1"
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    init_distributed(rank, WORLD, WORLD, init_method, device)
    one_shot = symm_all_reduce()
    assert one_shot is not None, "symmetric memory did not set up (see the log)"
    weight = _randn((HIDDEN,), 7) + 1
    for i, rows in enumerate(ROWS):
        _check_one(one_shot, rank, rows, i, weight)

    # tensors it does not take: the fused path declines, the same on every rank
    assert one_shot.add_rms_norm(_randn((2, 5120), 1), _randn((2, 5120), 2), _randn((5120,), 2), EPS) is None
    big = _randn((256, HIDDEN), 3)
    assert one_shot.add_rms_norm(big, big.clone(), weight, EPS) is None

    # 400 calls with no wait between them: a rank that ran ahead would overwrite rows its peer still reads
    for rows in (1, 5, 128):
        xs = [_randn((rows, HIDDEN), 1000 + 2 * j + rank) for j in range(4)]
        residuals = [_randn((rows, HIDDEN), 1100 + j) for j in range(4)]
        expected = [_reference(x, r, weight) for x, r in zip(xs, residuals, strict=True)]
        got = [one_shot.add_rms_norm(xs[j % 4], residuals[j % 4].clone(), weight, EPS) for j in range(400)]
        for j, (out, residual) in enumerate(got):
            assert torch.equal(residual, expected[j % 4][1]), f"{rows} rows, call {j}: residual"
            _assert_norm_close(out, expected[j % 4][0])
        assert _same_on_every_rank(torch.stack([out for out, _ in got]))

    # replayed in a CUDA graph, as decode steps run it
    for rows in (1, 5):
        static_x = torch.zeros((rows, HIDDEN), dtype=torch.bfloat16, device=device)
        static_residual = torch.zeros_like(static_x)
        one_shot.add_rms_norm(static_x, static_residual.clone(), weight, EPS)  # warm-up outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out, _ = one_shot.add_rms_norm(static_x, static_residual, weight, EPS)
            out, _ = one_shot.add_rms_norm(out * static_x, static_residual, weight, EPS)
        for trial in range(20):
            x = _randn((rows, HIDDEN), 3000 + 2 * trial + rank)
            residual = _randn((rows, HIDDEN), 4000 + trial)
            static_x.copy_(x)
            static_residual.copy_(residual)
            graph.replay()
            first, mid = _reference(x, residual, weight)
            expected, _ = _reference(first * x, mid, weight)
            torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)
            assert _same_on_every_rank(out)
    torch.cuda.synchronize()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_all_reduce_rms_norm_equals_nccl_then_the_norm() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_check, args=(f"tcp://127.0.0.1:{port}",), nprocs=WORLD, join=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("world", [2, 4])
def test_ranks_as_streams_of_one_gpu(world: int) -> None:
    """Each rank's kernel on a stream of its own, all running at once and meeting at their flags; rank r's buffer
    and flags are plain memory of the one GPU. The sum is in float32 in rank order, rounded once."""
    buffers = [torch.empty(128 * HIDDEN, dtype=torch.bfloat16, device="cuda") for _ in range(world)]
    flags = [torch.empty(FLAGS_PER_RANK * world, dtype=torch.int32, device="cuda") for _ in range(world)]
    for f in flags:
        reset_flags(f)
    buffer_ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64, device="cuda")
    flag_ptrs = torch.tensor([f.data_ptr() for f in flags], dtype=torch.int64, device="cuda")
    streams = [torch.cuda.Stream() for _ in range(world)]
    weight = _randn((HIDDEN,), 7) + 1
    for i, rows in enumerate(ROWS):
        xs = [_randn((rows, HIDDEN), 10 * i + rank) for rank in range(world)]
        total = xs[0].float()
        for x in xs[1:]:  # in rank order, as the kernel sums
            total = total + x.float()
        total = total.to(torch.bfloat16)
        residual = _randn((rows, HIDDEN), 10 * i + 9)
        expected, chain = [], residual.clone()
        for _ in range(50):
            expected.append((fused_add_rms_norm(total, chain, weight, EPS)[0], chain.clone()))
        residuals = [residual.clone() for _ in range(world)]
        torch.cuda.synchronize()
        got: list[list[torch.Tensor]] = [[] for _ in range(world)]
        for rank in range(world):
            with torch.cuda.stream(streams[rank]):
                for _ in range(50):  # back to back: each call may launch while the one before runs (PDL)
                    got[rank].append(all_reduce_rms_norm(xs[rank], residuals[rank], weight, EPS, buffer_ptrs,
                                                         flag_ptrs, rank))
        torch.cuda.synchronize()
        for rank in range(world):
            assert torch.equal(residuals[rank], expected[-1][1]), f"{rows} rows, rank {rank}: residual"
            for j, out in enumerate(got[rank]):
                _assert_norm_close(out, expected[j][0])
            assert torch.equal(torch.stack(got[rank]), torch.stack(got[0])), f"{rows} rows: the ranks' norms differ"
