from collections.abc import Iterable
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from wick.loader.model_source import resolve_model
from wick.loader.safetensors_loader import (
    INDEX_FILE,
    count_safetensors_tensors,
    iter_safetensors_weights,
    safetensors_files,
)
from wick.loader.weights import load_weights

CONFIG = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=256, max_position_embeddings=64,
                     tie_word_embeddings=False)


class StandIn(LlamaForCausalLM):
    """HF Llama with the `load_weights` method our models have: copy by HF name, return the names."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            params[name].copy_(tensor)
            loaded.add(name)
        return loaded


class Forgetful(StandIn):
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights((n, t) for n, t in weights if "layers.1." not in n)


def _save(folder: Path, max_shard_size: str | None = None) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = LlamaForCausalLM(CONFIG)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(folder, **kwargs)
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_sharded_checkpoint_yields_every_tensor_once(tmp_path: Path) -> None:
    originals = _save(tmp_path, max_shard_size="20KB")
    assert (tmp_path / INDEX_FILE).is_file()
    assert len(safetensors_files(str(tmp_path))) > 1
    names = []
    for name, tensor in iter_safetensors_weights(str(tmp_path)):
        names.append(name)
        torch.testing.assert_close(tensor, originals[name], rtol=0, atol=0)
    assert len(names) == len(set(names))
    assert set(names) == set(originals)
    assert count_safetensors_tensors(str(tmp_path)) == len(originals)


def test_single_file_checkpoint(tmp_path: Path) -> None:
    originals = _save(tmp_path)
    assert safetensors_files(str(tmp_path)) == [str(tmp_path / "model.safetensors")]
    weights = dict(iter_safetensors_weights(str(tmp_path)))
    assert weights.keys() == originals.keys()
    for name, tensor in weights.items():
        assert torch.equal(tensor, originals[name])


def test_no_safetensors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        safetensors_files(str(tmp_path))


def test_load_weights_fills_every_parameter(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    originals = _save(tmp_path, max_shard_size="20KB")
    torch.manual_seed(1)
    model = StandIn(CONFIG)
    load_weights(model, resolve_model(str(tmp_path)))
    for name, param in model.named_parameters():
        assert torch.equal(param, originals[name])
    err = capsys.readouterr().err
    assert "Loading weights" in err and f"{len(originals)}/{len(originals)}" in err


def test_load_weights_names_missing_parameters(tmp_path: Path) -> None:
    _save(tmp_path)
    with pytest.raises(ValueError, match=r"lacks weights for 9 .*model\.layers\.1\.mlp\.down_proj\.weight"):
        load_weights(Forgetful(CONFIG), resolve_model(str(tmp_path)))


@pytest.mark.slow
def test_load_weights_from_gguf(smollm2_gguf: str) -> None:
    source = resolve_model(smollm2_gguf)
    model = StandIn(source.config)
    load_weights(model, source)
    assert model.model.embed_tokens.weight.abs().sum() > 0
