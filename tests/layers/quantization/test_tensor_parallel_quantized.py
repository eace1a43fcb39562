"""Quantized layers shard for tensor parallelism: two gloo ranks loading a GPTQ (act-order), AWQ or
per-tensor FP8 checkpoint produce the logits of one rank. (GGUF's column splits are in test_gguf.py.)"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from int_checkpoints import awq_tensors, gptq_tensors
from paged_generate import PagedRunner, Sequence
from quantized_pair import build_ours, is_projection, small_llama

from wick.layers.quantization.awq import AWQConfig
from wick.layers.quantization.base import QuantizationConfig
from wick.layers.quantization.fp8 import FP8_MAX, Fp8Config
from wick.layers.quantization.gptq import GPTQConfig

PROMPT = [5, 17, 3, 99, 42, 7, 8, 250, 31]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _checkpoint(hf: torch.nn.Module, name: str) -> list[tuple[str, torch.Tensor]]:
    checkpoint = []
    for key, tensor in hf.state_dict().items():
        if not is_projection(key):
            checkpoint.append((key, tensor))
            continue
        prefix = key.removesuffix(".weight")
        if name == "fp8":
            scale = tensor.abs().max() / FP8_MAX
            checkpoint += [(key, (tensor / scale).to(torch.float8_e4m3fn)), (f"{prefix}.weight_scale", scale)]
            continue
        if name == "gptq":
            perm = torch.randperm(tensor.shape[1], generator=torch.Generator().manual_seed(0))
            tensors, _ = gptq_tensors(tensor, 4, 64, True, False, perm)
        else:
            tensors, _ = awq_tensors(tensor, 64)
        checkpoint += [(f"{prefix}.{k}", v) for k, v in tensors.items()]
    return checkpoint


def _config(name: str) -> QuantizationConfig:
    return {"gptq": GPTQConfig(4, 64, True, False, 1), "awq": AWQConfig(64, True), "fp8": Fp8Config()}[name]


def _rank_main(rank: int, world: int, port: int, name: str, config, checkpoint: list, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        model = build_ours(config, _config(name), checkpoint)
        (logits,) = PagedRunner(model).step([(Sequence(list(PROMPT)), len(PROMPT))])
        if rank == 0:
            torch.save(logits, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gptq", "awq", "fp8"])
def test_two_ranks_match_one(name: str, tmp_path: Path) -> None:
    hf = small_llama()
    checkpoint = _checkpoint(hf, name)
    (expected,) = PagedRunner(build_ours(hf.config, _config(name), checkpoint)).step(
        [(Sequence(list(PROMPT)), len(PROMPT))])
    out = tmp_path / "rank0.pt"
    mp.spawn(_rank_main, args=(2, _free_port(), name, hf.config, checkpoint, str(out)), nprocs=2)
    torch.testing.assert_close(torch.load(out), expected, atol=1e-4, rtol=1e-4)
