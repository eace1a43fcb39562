"""Tensor parallelism through the engine (CPU, gloo): worker processes driven over the step contract
give the tokens of one rank, for every supported architecture."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from models.hf_configs import hf_configs, hf_model, prompts

from wick import LLM, SamplingParams
from wick.config import EngineArgs
from wick.executor.multiproc import MultiprocExecutor

NEW_TOKENS = 12


def _model_dir(name: str, folder: Path, tokenizer_dir: str) -> str:
    hf_model(hf_configs()[name]).save_pretrained(folder)
    for file in Path(tokenizer_dir).glob("tokenizer*"):
        shutil.copy(file, folder)
    return str(folder)


def _generate(model: str, tp: int, overlap: bool = False) -> list[list[int]]:
    llm = LLM(model, tensor_parallel_size=tp, max_model_len=64, max_num_batched_tokens=32, block_size=4,
              async_scheduling=overlap)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
        # Chunked prefill (budget 32 < the longest prompt with the others) and a mixed batch.
        vocab = llm.config.hf_config.vocab_size
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts(vocab)], params)
        if tp > 1:
            assert isinstance(llm.core.executor, MultiprocExecutor)
            assert llm.core.executor.worker.runner.model.model.embed_tokens.weight.shape[0] == -(-vocab // tp)
        return [o.outputs[0].token_ids for o in outputs]
    finally:
        llm.core.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(hf_configs()))
def test_tp2_gives_the_tokens_of_one_rank(name: str, tmp_path: Path, tiny_llama_dir: str) -> None:
    model = _model_dir(name, tmp_path, tiny_llama_dir)
    single = _generate(model, 1)
    assert _generate(model, 2) == single


def test_tp2_with_overlapped_scheduling_gives_the_tokens_of_one_rank(tmp_path: Path, tiny_llama_dir: str) -> None:
    """The other rank takes its own steps' tokens (nobody collects its outputs) and reads the previous
    sample on its device, as rank 0 does."""
    model = _model_dir("llama3", tmp_path, tiny_llama_dir)
    assert _generate(model, 2, overlap=True) == _generate(model, 1)


def test_a_size_that_does_not_divide_the_heads_is_refused(tiny_llama_dir: str) -> None:
    with pytest.raises(ValueError, match="tensor_parallel_size 3 must divide the model's 4 attention heads"):
        EngineArgs(model=tiny_llama_dir, tensor_parallel_size=3).create_engine_config()
    with pytest.raises(ValueError, match="not a multiple of nnodes"):
        EngineArgs(model=tiny_llama_dir, tensor_parallel_size=2, nnodes=4, node_rank=1,
                   master_port=29555).create_engine_config()
