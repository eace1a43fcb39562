"""Sampling defaults: the model's generation_config.json, then the server's flags, then the request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wick.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from wick.loader.model_source import ModelSource
from wick.sampling_defaults import SamplingDefaults, model_generation_config
from wick.sampling_params import SamplingParams

GENERATION_CONFIG = {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.05,
                     "max_new_tokens": 300, "eos_token_id": [1, 2], "bos_token_id": 1}


def folder_model(folder: Path, generation_config: dict | None = None) -> ModelSource:
    if generation_config is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation_config))
    return ModelSource(kind="safetensors", path=str(folder), config=None, tokenizer_path=str(folder),
                       gguf_file=None)


def test_the_models_generation_config_is_read(tmp_path: Path):
    source = folder_model(tmp_path, GENERATION_CONFIG)
    assert model_generation_config(source) == {"temperature": 0.6, "top_p": 0.9, "top_k": 20,
                                               "repetition_penalty": 1.05, "max_tokens": 300}
    assert model_generation_config(source, "vllm") == {}
    defaults = SamplingDefaults.resolve(source)
    assert defaults.max_tokens == 300
    assert defaults.values == {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.05}


def test_generation_config_from_another_folder_and_a_missing_one(tmp_path: Path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "generation_config.json").write_text(json.dumps({"temperature": 0.3}))
    source = folder_model(tmp_path)
    assert model_generation_config(source) == {}
    assert model_generation_config(source, str(other)) == {"temperature": 0.3}
    with pytest.raises(ValueError, match="no generation_config.json"):
        model_generation_config(source, str(tmp_path / "nowhere"))


def test_the_default_model_answers_greedily(smollm2_gguf: str):
    source = ModelSource(kind="gguf", path=smollm2_gguf, config=None, tokenizer_path=str(Path(smollm2_gguf).parent),
                         gguf_file=smollm2_gguf)
    assert SamplingDefaults.resolve(source).values == {"temperature": 0.0}
    assert SamplingDefaults.resolve(source, "vllm").values == {}


def test_server_flags_win_over_the_model_and_are_checked(tmp_path: Path):
    source = folder_model(tmp_path, GENERATION_CONFIG)
    defaults = SamplingDefaults.resolve(source, overrides={"temperature": 0.2, "presence_penalty": 0.5,
                                                           "max_tokens": 50})
    assert defaults.values["temperature"] == 0.2 and defaults.values["top_p"] == 0.9
    assert defaults.values["presence_penalty"] == 0.5 and defaults.max_tokens == 50
    with pytest.raises(ValueError, match="top_p"):
        SamplingDefaults.resolve(source, overrides={"top_p": 0.0})
    with pytest.raises(ValueError, match="unknown sampling defaults"):
        SamplingDefaults.resolve(source, overrides={"beam_width": 4})


def test_a_requests_own_values_win_and_the_rest_come_from_the_defaults(tmp_path: Path):
    defaults = SamplingDefaults.resolve(folder_model(tmp_path, GENERATION_CONFIG))
    omitted = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}])
    params = omitted.sampling_params(10, None, defaults=defaults)
    assert (params.temperature, params.top_p, params.top_k, params.repetition_penalty) == (0.6, 0.9, 20, 1.05)
    own = CompletionRequest(prompt="hi", temperature=1.0, top_p=0.5, top_k=-1, repetition_penalty=1.0)
    params = own.sampling_params(10, None, defaults=defaults)
    assert (params.temperature, params.top_p, params.top_k, params.repetition_penalty) == (1.0, 0.5, 0, 1.0)
    assert omitted.sampling_params(10, None).temperature == SamplingParams().temperature


def test_default_max_tokens_is_bounded_by_the_context():
    assert SamplingDefaults().max_tokens_for(room=8000, max_model_len=8192) == 8192 // 5
    assert SamplingDefaults().max_tokens_for(room=100, max_model_len=8192) == 100
    assert SamplingDefaults(max_tokens=300).max_tokens_for(room=8000, max_model_len=8192) == 300
    assert SamplingDefaults(max_tokens=300).max_tokens_for(room=20, max_model_len=8192) == 20
