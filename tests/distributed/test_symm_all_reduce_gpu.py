"""The tensor-parallel all-reduce on two GPUs (bf16): the one-shot kernel over symmetric memory for small
tensors, NCCL above its limit, equal to NCCL's own all-reduce, eagerly and replayed in a CUDA graph."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from wick.distributed.communication import tp_all_reduce
from wick.distributed.parallel_state import init_distributed
from wick.distributed.symm_all_reduce import symm_all_reduce

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")]

WORLD = 2
# Decode activations of 1, 3, 16 and 128 tokens (Llama-3.1-8B's 4096 and Qwen2.5-32B's 5120 features),
# and 256 tokens, above the one-shot limit: 8 KiB .. 2 MiB.
SHAPES = [(1, 4096), (3, 5120), (16, 4096), (128, 4096), (256, 4096)]


def _inputs(rank: int, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    generator = torch.Generator(device="cuda").manual_seed(seed * WORLD + rank)
    return torch.randn(shape, generator=generator, device="cuda").to(torch.bfloat16)


def _nccl(x: torch.Tensor) -> torch.Tensor:
    expected = x.clone()
    dist.all_reduce(expected)
    return expected


def _check(rank: int, init_method: str) -> None:
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    init_distributed(rank, WORLD, WORLD, init_method, device)
    one_shot = symm_all_reduce()
    assert one_shot is not None, "symmetric memory did not set up (see the log)"
    for i, shape in enumerate(SHAPES):
        x = _inputs(rank, shape, i)
        assert one_shot.can_reduce(x) == (x.nbytes <= one_shot.max_bytes)
        # Two ranks: one addition per element either way, so the sums are bitwise equal.
        assert torch.equal(tp_all_reduce(x.clone()), _nccl(x)), f"eager {shape}"

        static = torch.zeros_like(x)
        tp_all_reduce(static)  # warm-up outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = tp_all_reduce(static)
        for trial in range(3):
            x = _inputs(rank, shape, 100 * (i + 1) + trial)
            static.copy_(x)
            graph.replay()
            assert torch.equal(out, _nccl(x)), f"graph {shape}, replay {trial}"
    torch.cuda.synchronize()


def test_one_shot_all_reduce_equals_nccl_eager_and_in_a_cuda_graph() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_check, args=(f"tcp://127.0.0.1:{port}",), nprocs=WORLD, join=True)
