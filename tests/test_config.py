"""EngineArgs -> EngineConfig: the context length a model's attention allows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from wick.config import EngineArgs
from wick.loader.presets import PRESETS

MISTRAL_V01 = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 64,
               "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1,
               "vocab_size": 256, "max_position_embeddings": 32768, "sliding_window": 4096}


def _model(tmp_path: Path, config: dict) -> str:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_a_sliding_window_model_serves_its_full_context(tmp_path: Path) -> None:
    model = _model(tmp_path, MISTRAL_V01)
    assert EngineArgs(model=model, load_format="dummy", device="cpu").create_engine_config().max_model_len == 32768
    assert EngineArgs(model=model, load_format="dummy", device="cpu",
                      max_model_len=8192).create_engine_config().max_model_len == 8192


@pytest.mark.parametrize("config", [{**MISTRAL_V01, "sliding_window": None},
                                    {**MISTRAL_V01, "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"],
                                     "use_sliding_window": False}])
def test_full_attention_models_keep_their_positions(tmp_path: Path, config: dict) -> None:
    model = _model(tmp_path, config)
    assert EngineArgs(model=model, load_format="dummy", device="cpu").create_engine_config().max_model_len == 32768


def test_the_qwen_presets_are_full_attention() -> None:
    config = EngineArgs(model="qwen2.5-0.5b", load_format="dummy", device="cpu").create_engine_config()
    assert config.max_model_len == PRESETS["qwen2.5-0.5b"]["max_position_embeddings"]


def test_yarn_scaling_factor_stretches_the_context(tiny_llama_dir: str):
    from wick.layers.rotary import rope_parameters

    config = EngineArgs(model=tiny_llama_dir, yarn_scaling_factor=4.0).create_engine_config()
    assert config.max_model_len == 4 * 512
    theta, scaling = rope_parameters(config.hf_config)
    assert scaling == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}
    with pytest.raises(ValueError, match="yarn_scaling_factor"):
        EngineArgs(model=tiny_llama_dir, yarn_scaling_factor=0.5)


@pytest.mark.parametrize(("device", "chosen", "overlap"), [
    ("cpu", None, False), ("cuda", None, True), ("cuda", False, False), ("cpu", True, True)])
def test_overlap_is_on_by_default_where_a_step_runs_asynchronously(device: str, chosen: bool | None,
                                                                   overlap: bool) -> None:
    config = EngineArgs(model="qwen2.5-0.5b", load_format="dummy", device="cpu",
                        async_scheduling=chosen).create_engine_config()
    config.device = torch.device(device)  # the property reads the device only: no GPU is needed to ask
    assert config.async_scheduling is overlap
