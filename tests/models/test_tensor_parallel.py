"""Tensor parallelism on CPU (gloo): TP ranks produce the logits of the unsharded model."""

from __future__ import annotations

import copy
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hf_configs import build_pair, hf_configs, prompts
from paged_generate import PagedRunner
from transformers import PretrainedConfig

from wick.models.registry import get_model_class

NEW_TOKENS = 6


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(
    rank: int, world: int, port: int, arch: str, config: PretrainedConfig, state: dict, ps: list, out: str
) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        model = get_model_class([arch])(config).eval()
        model.load_weights(state.items())
        assert model.model.embed_tokens.weight.shape[0] == -(-config.vocab_size // world)
        results = PagedRunner(model).generate(ps, NEW_TOKENS)
        if rank == 0:
            torch.save(results, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize(("name", "world"), [
    ("llama_tied_bias", 2), ("qwen2", 4), ("qwen2_moe", 2), ("gemma3", 2), ("deepseek_v3", 2)])
def test_tp_matches_single_rank(name: str, world: int, tmp_path: Path) -> None:
    config = copy.deepcopy(hf_configs()[name])
    config.vocab_size = 250  # not a multiple of the TP size: the last rank holds padding rows
    hf, ours = build_pair(config)
    ps = prompts(config.vocab_size)[1:3]
    expected = PagedRunner(ours).generate(ps, NEW_TOKENS)

    out = tmp_path / "rank0.pt"
    args = (world, _free_port(), type(hf).__name__, config, hf.state_dict(), ps, str(out))
    mp.spawn(_rank_main, args=args, nprocs=world)
    for (tokens, logits), (tp_tokens, tp_logits) in zip(expected, torch.load(out), strict=True):
        assert tp_tokens == tokens
        torch.testing.assert_close(tp_logits, logits, atol=1e-4, rtol=1e-4)
