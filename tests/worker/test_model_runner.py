"""The CPU KV cache's default size: a few full-length sequences, not a fixed 2 GiB."""

from __future__ import annotations

import pytest

from wick import LLM, SamplingParams
from wick.config import CPU_KV_CACHE_SEQS, EngineArgs
from wick.worker.model_runner import ModelRunner


@pytest.mark.parametrize(("max_num_seqs", "full_sequences"), [(256, CPU_KV_CACHE_SEQS), (1, 1)])
def test_cpu_kv_cache_holds_a_few_full_length_sequences(tiny_llama_dir: str, max_num_seqs: int,
                                                        full_sequences: int, caplog: pytest.LogCaptureFixture):
    config = EngineArgs(model=tiny_llama_dir, max_model_len=256, max_num_seqs=max_num_seqs,
                        device="cpu").create_engine_config()
    runner = ModelRunner(config)
    with caplog.at_level("INFO", logger="wick.worker.model_runner"):
        num_blocks = runner.determine_num_blocks()
    assert num_blocks == full_sequences * 256 // config.block_size
    assert num_blocks * runner.kv_bytes_per_block() < 1 << 20
    assert "KV cache on CPU" in caplog.text


def test_kv_cache_memory_still_decides(tiny_llama_dir: str):
    config = EngineArgs(model=tiny_llama_dir, max_model_len=256, kv_cache_memory=1 << 20,
                        device="cpu").create_engine_config()
    runner = ModelRunner(config)
    assert runner.determine_num_blocks() == (1 << 20) // runner.kv_bytes_per_block()


@pytest.mark.parametrize("max_num_seqs", [3, 6])
def test_a_full_batch_fits_the_step_buffers(tiny_llama_dir: str, max_num_seqs: int):
    """max_num_seqs between the captured graph sizes (1, 2, 4, 8, ...): a step of every running request still fits."""
    config = EngineArgs(model=tiny_llama_dir, max_model_len=256, max_num_seqs=max_num_seqs,
                        device="cpu").create_engine_config()
    runner = ModelRunner(config)
    assert runner.buffers.max_reqs >= max_num_seqs
    llm = LLM(tiny_llama_dir, device="cpu", max_model_len=256, max_num_seqs=max_num_seqs)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    outputs = llm.generate([[5 + i, 17, 33] for i in range(max_num_seqs)], params)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [4] * max_num_seqs
