"""The real GGUF models with packed weights: the same teacher-forced argmax as the dequantized
path, and (Qwen2.5-Coder Q4_K_M) a process that grows by at most 1.5x the file when loaded."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from paged_generate import PagedRunner, Sequence
from transformers import PreTrainedTokenizerBase

from wick.layers.quantization.base import quantization_scope
from wick.layers.quantization.gguf import GGUFConfig
from wick.loader.model_source import resolve_model
from wick.loader.weights import load_weights
from wick.models.registry import get_model_class

TEXT = (
    "The history of computing is longer than the history of computing hardware and modern computing "
    "technology and includes the history of methods intended for pen and paper or for chalk and slate.\n"
    "def binary_search(items, target):\n"
    "    low, high = 0, len(items) - 1\n"
    "    while low <= high:\n"
    "        mid = (low + high) // 2\n"
    "        if items[mid] == target:\n"
    "            return mid\n"
)


def _model(path: str, packed: bool) -> torch.nn.Module:
    source = resolve_model(path)
    config = GGUFConfig() if packed else None
    with quantization_scope(config):
        model = get_model_class(source.config.architectures)(source.config).eval()
    load_weights(model, source, quant_config=config)
    return model


def _teacher_forced_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    (logits,) = PagedRunner(model, num_blocks=64, block_size=16).step([(Sequence(list(ids)), len(ids))])
    return logits


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2_gguf", "qwen_gguf"])
def test_packed_argmax_equals_dequantized(name: str, request: pytest.FixtureRequest) -> None:
    path = request.getfixturevalue(name)
    tokenizer = request.getfixturevalue(name.replace("_gguf", "_tokenizer"))  # the file's, loaded once a session
    ids = tokenizer(TEXT)["input_ids"]
    packed = _model(path, packed=True)
    assert all(p.data.dtype == torch.uint8 for p in packed.model.layers[0].mlp.gate_up_proj.gguf_parts)
    assert packed.model.embed_tokens.weight.dtype == torch.uint8
    got = _teacher_forced_logits(packed, ids).argmax(-1)
    del packed
    expected = _teacher_forced_logits(_model(path, packed=False), ids).argmax(-1)
    assert len(ids) > 80
    assert torch.equal(got, expected)


_MEASURE = textwrap.dedent("""
    import sys
    def rss():
        return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmRSS"))
    from wick import LLM
    before = rss()
    llm = LLM(sys.argv[1], max_model_len=256, max_num_seqs=1)
    print(rss() - before)
""")


@pytest.mark.slow
def test_qwen_process_grows_by_at_most_one_and_a_half_files(qwen_gguf: str) -> None:
    # The CPU's default path: its kernels hold copies of the Q4_K and Q8_0 weights, not the file's pages.
    env = {key: value for key, value in os.environ.items() if key != "WICK_CPU_QUANT_KERNELS"}
    result = subprocess.run([sys.executable, "-c", _MEASURE, qwen_gguf], capture_output=True, text=True,
                            check=True, env={**env, "CUDA_VISIBLE_DEVICES": ""})
    growth = int(result.stdout.split()[-1])
    assert growth <= 1.5 * os.path.getsize(qwen_gguf), f"grew {growth / 2**20:.0f} MiB"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_qwen_packed_on_gpu_agrees_with_dequantized_cpu(qwen_gguf: str, qwen_tokenizer: PreTrainedTokenizerBase,
                                                        backend: str) -> None:
    """The Triton GGUF kernels in bf16 against the fp32 dequantized path, position by position."""
    from wick import LLM, SamplingParams

    path = qwen_gguf
    ids = qwen_tokenizer(TEXT)["input_ids"]
    expected = _teacher_forced_logits(_model(path, packed=False), ids).argmax(-1).tolist()
    llm = LLM(path, device="cuda", dtype="bfloat16", max_model_len=512, attention_backend=backend)
    out = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=1))[0]
    top = [next(t for t, lp in entry.items() if lp.rank == 1) for entry in out.prompt_logprobs[1:]]
    agree = sum(a == b for a, b in zip(top, expected[:-1], strict=True)) / len(top)
    assert agree >= 0.95, f"{agree:.1%} of positions agree"
