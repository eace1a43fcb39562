"""What a sentence-transformers folder says: whether it embeds, its pooling, normalisation and longest input; and
the task the engine config resolves from it (auto, --task embed, --task generate)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import BertConfig, LlamaConfig

from wick.config import EngineArgs
from wick.layers.pooler import PoolingType
from wick.loader.sentence_transformers import is_sentence_transformers, max_seq_length, pooler_config

TRANSFORMER = {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}
POOLING = {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}
NORMALIZE = {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}


def st_folder(folder: Path, modules: list[dict], pooling: dict | None = None) -> Path:
    (folder / "modules.json").write_text(json.dumps(modules))
    if pooling is not None:
        (folder / "1_Pooling").mkdir()
        (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return folder


@pytest.mark.parametrize(("mode", "kind"), [("pooling_mode_cls_token", PoolingType.CLS),
                                            ("pooling_mode_mean_tokens", PoolingType.MEAN),
                                            ("pooling_mode_lasttoken", PoolingType.LAST)])
def test_pooling_mode_and_normalize(tmp_path: Path, mode: str, kind: PoolingType) -> None:
    folder = st_folder(tmp_path, [TRANSFORMER, POOLING], {mode: True, "pooling_mode_max_tokens": False})
    assert is_sentence_transformers(str(folder))
    config = pooler_config(str(folder), BertConfig(hidden_size=32), encoder=True)
    assert (config.pooling_type, config.normalize, config.hidden_size) == (kind, False, 32)
    (folder / "modules.json").write_text(json.dumps([TRANSFORMER, POOLING, NORMALIZE]))
    assert pooler_config(str(folder), BertConfig(hidden_size=32), encoder=True).normalize


def test_without_sentence_transformers_files(tmp_path: Path) -> None:
    assert not is_sentence_transformers(str(tmp_path)) and max_seq_length(str(tmp_path)) is None
    assert pooler_config(str(tmp_path), BertConfig(), encoder=True).pooling_type is PoolingType.CLS
    decoder = pooler_config(None, LlamaConfig(hidden_size=64, matryoshka_dimensions=[32, 64]), encoder=False)
    assert (decoder.pooling_type, decoder.normalize, decoder.is_matryoshka) == (PoolingType.LAST, True, True)
    assert decoder.matryoshka_dimensions == (32, 64)


def test_what_wick_cannot_apply_is_refused(tmp_path: Path) -> None:
    dense = {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
    folder = st_folder(tmp_path, [TRANSFORMER, POOLING, dense], {"pooling_mode_mean_tokens": True})
    with pytest.raises(ValueError, match="modules wick cannot apply: Dense"):
        pooler_config(str(folder), BertConfig(), encoder=True)
    (folder / "modules.json").write_text(json.dumps([TRANSFORMER, POOLING]))
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_max_tokens": True}))
    with pytest.raises(ValueError, match="asks for pooling_mode_max_tokens"):
        pooler_config(str(folder), BertConfig(), encoder=True)


def test_the_engine_config_resolves_the_task(minilm_dir: str, tiny_llama_dir: str) -> None:
    config = EngineArgs(model=minilm_dir, device="cpu").create_engine_config()
    assert config.task == "embed" and config.max_model_len == 256  # sentence_bert_config.json's max_seq_length
    assert not config.args.enable_prefix_caching and not config.args.enable_chunked_prefill
    assert config.max_num_batched_tokens >= config.max_model_len
    with pytest.raises(ValueError, match="BertModel has no LM head: it serves embeddings only"):
        EngineArgs(model=minilm_dir, device="cpu", task="generate").create_engine_config()
    assert EngineArgs(model=tiny_llama_dir, device="cpu").create_engine_config().task == "generate"
    forced = EngineArgs(model=tiny_llama_dir, device="cpu", task="embed").create_engine_config()
    assert forced.task == "embed" and forced.pooler_config.pooling_type is PoolingType.LAST
    with pytest.raises(ValueError, match="task must be one of"):
        EngineArgs(task="classify")
