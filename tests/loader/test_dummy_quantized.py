"""`--load-format dummy` with every quantization: random weights in the format's own layout, a forward
that runs, and the load log line with the format and the size."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest
import torch

from wick.config import EngineArgs
from wick.layers.quantization.base import quantization_scope
from wick.loader.weights import load_weights
from wick.models.registry import get_model_class

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from paged_generate import PagedRunner, Sequence  # noqa: E402

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 256, "hidden_size": 256,
          "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 256, "tie_word_embeddings": False}


@pytest.mark.parametrize(("quantization", "marker", "label"), [
    ("q4k", "gguf_parts", "Q4_K (in-situ)"), ("q8_0", "gguf_parts", "Q8_0 (in-situ)"),
    ("gptq", "qweight", "GPTQ 4-bit g128"), ("awq", "qweight", "AWQ 4-bit g128"),
    ("fp8", "weight", "FP8 e4m3 (in-situ, per row)"), (None, "weight", "float32"),
])
def test_dummy_weights_in_every_format(tmp_path: Path, caplog: pytest.LogCaptureFixture, quantization: str | None,
                                       marker: str, label: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    config = EngineArgs(model=str(tmp_path), load_format="dummy", quantization=quantization,
                        device="cpu").create_engine_config()
    with quantization_scope(config.quant_config):
        model = get_model_class(CONFIG["architectures"])(config.hf_config).eval()
    with caplog.at_level(logging.INFO, logger="wick.loader.weights"):
        load_weights(model, config.source, seed=0, quant_config=config.quant_config)
    assert any(record.getMessage().startswith(f"weights: {label}, ") and "GiB on cpu" in record.getMessage()
               for record in caplog.records)
    layer = model.model.layers[1].mlp.down_proj
    assert getattr(layer, marker) is not None
    (logits,) = PagedRunner(model).step([(Sequence([5, 9, 2, 7]), 4)])
    assert torch.isfinite(logits).all() and logits.abs().max() > 0


def test_the_load_log_names_the_dtype_the_weights_are_in(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Models are built under their dtype and the default dtype is restored after: the log reads the weights."""
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    config = EngineArgs(model=str(tmp_path), load_format="dummy", device="cpu").create_engine_config()
    model = get_model_class(CONFIG["architectures"])(config.hf_config).to(torch.bfloat16).eval()
    assert torch.get_default_dtype() == torch.float32
    with caplog.at_level(logging.INFO, logger="wick.loader.weights"):
        load_weights(model, config.source, seed=0)
    assert any(record.getMessage().startswith("weights: bfloat16, ") for record in caplog.records)


def test_dummy_experts_quantized_in_situ(tmp_path: Path) -> None:
    """`-q q4_k` on an MoE model: the experts are random Q4_K blocks, as a float checkpoint's are quantized at
    load, and the model runs over them."""
    moe = dict(CONFIG, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", head_dim=64, num_experts=4,
               num_experts_per_tok=2, moe_intermediate_size=256, norm_topk_prob=True)
    (tmp_path / "config.json").write_text(json.dumps(moe))
    config = EngineArgs(model=str(tmp_path), load_format="dummy", quantization="q4k",
                        device="cpu").create_engine_config()
    with quantization_scope(config.quant_config):
        model = get_model_class(moe["architectures"])(config.hf_config).eval()
    load_weights(model, config.source, seed=0, quant_config=config.quant_config)
    experts = model.model.layers[1].mlp.experts
    assert experts.w13_weight.dtype == torch.uint8 and set(experts.packed) == {"w13", "w2"}
    decoded = experts.packed["w2"].dequantize_all()
    assert decoded.abs().max() < 1.1e-3 and decoded.std() > 1e-4  # uniform in [-1e-3, 1e-3], rounded
    (logits,) = PagedRunner(model).step([(Sequence([5, 9, 2, 7]), 4)])
    assert torch.isfinite(logits).all() and logits.abs().max() > 0
