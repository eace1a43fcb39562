"""EngineArgs (what a user sets) -> the engine's resolved configuration."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from transformers import PretrainedConfig

from wick.layers.quantization import normalize_quantization, resolve_quantization
from wick.layers.quantization.base import QuantizationConfig
from wick.loader.gguf_loader import gguf_file_type
from wick.loader.model_source import ModelSource, resolve_model

logger = logging.getLogger(__name__)

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
}
_KV_CACHE_DTYPES = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn}
CPU_KV_CACHE_BYTES = 2 << 30


@dataclass
class EngineArgs:
    model: str | None = None
    tokenizer: str | None = None
    load_format: str = "auto"
    dtype: str = "auto"
    device: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    kv_cache_memory: int | None = None
    num_kv_blocks: int | None = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    attention_backend: str | None = None
    enforce_eager: bool = False
    tensor_parallel_size: int = 1
    seed: int = 0
    chat_template: str | None = None
    trust_remote_code: bool = False
    # Weights' format: None reads it from the checkpoint; an ISQ type (q4_k, q8_0, fp8...) quantizes at load.
    quantization: str | None = None
    # "auto": the model's dtype; "fp8" (= "fp8_e4m3"): e4m3 pages, twice the tokens in the same memory.
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.dtype != "auto" and self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be auto or one of {sorted(_DTYPES)}, got {self.dtype!r}")
        self.quantization = normalize_quantization(self.quantization)
        if self.kv_cache_dtype != "auto" and self.kv_cache_dtype not in _KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be auto or one of {', '.join(_KV_CACHE_DTYPES)}, "
                             f"got {self.kv_cache_dtype!r}")
        if self.tensor_parallel_size != 1:
            raise ValueError("tensor_parallel_size > 1 is not supported yet")

    def create_engine_config(self) -> EngineConfig:
        source = resolve_model(self.model, self.load_format, self.tokenizer)
        device = torch.device(self.device if self.device != "auto"
                              else ("cuda" if torch.cuda.is_available() else "cpu"))
        hf_config = source.config
        dtype = _resolve_dtype(self.dtype, hf_config, device)
        max_position = _max_position(hf_config)
        max_model_len = self.max_model_len or max_position
        window = _sliding_window(hf_config)
        if window is not None and max_model_len > window:
            # Within the window, full attention is sliding-window attention; beyond it they differ.
            if self.max_model_len is not None:
                raise ValueError(f"this model attends over a sliding window of {window} tokens, which wick does "
                                 f"not implement: max_model_len must be at most {window}, got {max_model_len}")
            logger.warning("max_model_len is %d, the model's sliding attention window", window)
            max_model_len = window
        if max_model_len > max_position:
            logger.warning("max_model_len %d exceeds the model's %d positions", max_model_len, max_position)
        file_type = gguf_file_type(source.gguf_file) if source.kind == "gguf" else None
        quant_config = resolve_quantization(self.quantization, source.kind, hf_config, file_type)
        max_batched = self.max_num_batched_tokens or max(8192, self.max_num_seqs)
        if not self.enable_chunked_prefill:
            max_batched = max(max_batched, max_model_len)
        return EngineConfig(args=self, source=source, hf_config=hf_config, device=device, dtype=dtype,
                            max_model_len=max_model_len, max_num_batched_tokens=max_batched,
                            quant_config=quant_config,
                            kv_cache_dtype=_KV_CACHE_DTYPES.get(self.kv_cache_dtype, dtype))


@dataclass
class EngineConfig:
    args: EngineArgs
    source: ModelSource
    hf_config: PretrainedConfig
    device: torch.device
    dtype: torch.dtype
    max_model_len: int
    max_num_batched_tokens: int
    extra: dict = field(default_factory=dict)
    quant_config: QuantizationConfig | None = None
    kv_cache_dtype: torch.dtype | None = None

    def __post_init__(self) -> None:
        if self.kv_cache_dtype is None:
            self.kv_cache_dtype = self.dtype

    @property
    def max_num_seqs(self) -> int:
        return self.args.max_num_seqs

    @property
    def block_size(self) -> int:
        return self.args.block_size


def _resolve_dtype(name: str, hf_config: PretrainedConfig, device: torch.device) -> torch.dtype:
    if name != "auto":
        return _DTYPES[name]
    if device.type == "cpu":
        return torch.float32
    config_dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(config_dtype, str):
        config_dtype = _DTYPES.get(config_dtype, torch.float32)
    return config_dtype if config_dtype in (torch.float16, torch.bfloat16) else torch.bfloat16


def _sliding_window(hf_config: PretrainedConfig) -> int | None:
    """The attention window of every layer (Mistral-7B-v0.1), or None for full attention."""
    window = getattr(hf_config, "sliding_window", None)
    if not window or getattr(hf_config, "use_sliding_window", True) is False:
        return None
    return int(window)


def _max_position(hf_config: PretrainedConfig) -> int:
    return int(getattr(hf_config, "max_position_embeddings", None) or 4096)
