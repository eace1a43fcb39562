"""EngineArgs (what a user sets) -> the engine's resolved configuration."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PretrainedConfig

from wick.layers.pooler import PoolerConfig
from wick.layers.quantization import normalize_quantization, resolve_quantization
from wick.layers.quantization.base import QuantizationConfig
from wick.loader import sentence_transformers
from wick.loader.gguf_loader import gguf_file_type
from wick.loader.model_source import ModelSource, resolve_model
from wick.models.registry import is_embedding_only

logger = logging.getLogger(__name__)

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
}
_KV_CACHE_DTYPES = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn}
TASKS = ("auto", "generate", "embed")
# The CPU's KV cache by default (docs/cpu.md): room for this many full-length sequences (any number of shorter ones
# share it), bounded by max_num_seqs of them and by this share of the memory available when the engine starts.
CPU_KV_CACHE_SEQS = 2
CPU_KV_CACHE_MEMORY_SHARE = 0.25


def available_memory_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (Linux), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


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
    # Schedule step N+1 while the device runs step N; None: on a GPU, where the step runs asynchronously.
    async_scheduling: bool | None = None
    tensor_parallel_size: int = 1
    # Several machines: node 0 serves and schedules; every node runs tensor_parallel_size / nnodes ranks.
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    seed: int = 0
    chat_template: str | None = None
    trust_remote_code: bool = False
    download_dir: str | None = None
    # Stretch the model's context by this factor with YaRN rope scaling (vllm.rs's --yarn-scaling-factor).
    yarn_scaling_factor: float | None = None
    # Sampling defaults (wick/sampling_defaults.py): "auto" (the model's generation_config.json), "vllm" (none)
    # or a folder; then these values (SamplingParams names) over it.
    generation_config: str = "auto"
    override_generation_config: dict[str, Any] | None = None
    # Weights' format: None reads it from the checkpoint; an ISQ type (q4_k, q8_0, fp8...) quantizes at load.
    quantization: str | None = None
    # "auto": the model's dtype; "fp8" (= "fp8_e4m3"): e4m3 pages, twice the tokens in the same memory.
    kv_cache_dtype: str = "auto"
    # "generate", "embed" (pooled hidden states), or "auto": embed for a sentence-transformers folder or an
    # architecture without an LM head, else generate.
    task: str = "auto"

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
        if self.yarn_scaling_factor is not None and not self.yarn_scaling_factor > 1.0:
            raise ValueError(f"yarn_scaling_factor must be > 1, got {self.yarn_scaling_factor}")
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, got {self.task!r}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank must be in [0, nnodes): got node_rank={self.node_rank}, nnodes={self.nnodes}")

    def create_engine_config(self) -> EngineConfig:
        source = resolve_model(self.model, self.load_format, self.tokenizer, self.download_dir)
        device = torch.device(self.device if self.device != "auto"
                              else ("cuda" if torch.cuda.is_available() else "cpu"))
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {self.device!r}: no CUDA device is usable here (this torch is "
                             f"{torch.__version__}{'' if torch.version.cuda else ', a build without CUDA'}); "
                             "use --device cpu")
        hf_config = source.config
        if self.yarn_scaling_factor is not None:
            _apply_yarn(hf_config, self.yarn_scaling_factor)
        dtype = _resolve_dtype(self.dtype, hf_config, device)
        pooler_config = self._pooler_config(source)
        max_position = _max_position(hf_config)
        max_model_len = self.max_model_len or max_position
        args = self
        if pooler_config is not None:
            # Embedding prompts run whole (the pooler needs every token's hidden state at once) and share no prefix.
            max_model_len = self.max_model_len or min(max_position, sentence_transformers.max_seq_length(
                source.path) or max_position)
            args = dataclasses.replace(self, enable_prefix_caching=False, enable_chunked_prefill=False)
        if max_model_len > max_position:
            logger.warning("max_model_len %d exceeds the model's %d positions", max_model_len, max_position)
        file_type = gguf_file_type(source.gguf_file) if source.kind == "gguf" else None
        quant_config = resolve_quantization(self.quantization, source.kind, hf_config, file_type)
        max_batched = self.max_num_batched_tokens or max(8192, self.max_num_seqs)
        if not args.enable_chunked_prefill:
            max_batched = max(max_batched, max_model_len)
        parallel = self._parallel_config(hf_config, device)
        return EngineConfig(args=args, source=source, hf_config=hf_config, device=device, dtype=dtype,
                            max_model_len=max_model_len, max_num_batched_tokens=max_batched, parallel=parallel,
                            quant_config=quant_config,
                            kv_cache_dtype=_KV_CACHE_DTYPES.get(self.kv_cache_dtype, dtype),
                            pooler_config=pooler_config)

    def _pooler_config(self, source: ModelSource) -> PoolerConfig | None:
        """How the model pools its embeddings, or None when it generates (the task, resolved)."""
        architectures = list(getattr(source.config, "architectures", None) or [])
        encoder_only = is_embedding_only(architectures)
        folder = source.path if source.kind != "gguf" else None
        task = self.task
        if task == "auto":
            task = "embed" if encoder_only or sentence_transformers.is_sentence_transformers(folder) else "generate"
        if task == "generate":
            if encoder_only:
                raise ValueError(f"{', '.join(architectures)} has no LM head: it serves embeddings only (--task embed)")
            return None
        encoder = getattr(source.config, "model_type", "") == "bert"
        return sentence_transformers.pooler_config(folder, source.config, encoder)

    def _parallel_config(self, hf_config: PretrainedConfig, device: torch.device) -> ParallelConfig:
        """The ranks, from the arguments or, when torchrun started every rank, from its environment."""
        env = os.environ
        tp, nnodes, node_rank = self.tensor_parallel_size, self.nnodes, self.node_rank
        launched = "TORCHELASTIC_RUN_ID" in env and int(env.get("WORLD_SIZE", "1")) > 1
        if launched:
            tp = int(env["WORLD_SIZE"])
            nnodes = tp // int(env.get("LOCAL_WORLD_SIZE", tp))
            node_rank = int(env.get("GROUP_RANK", "0"))
        elif "SLURM_NNODES" in env and nnodes == 1:
            nnodes, node_rank = int(env["SLURM_NNODES"]), int(env.get("SLURM_NODEID", "0"))
        if tp % nnodes:
            raise ValueError(f"tensor_parallel_size {tp} is not a multiple of nnodes {nnodes}")
        heads = hf_config.num_attention_heads
        kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
        if heads % tp or (kv_heads % tp and tp % kv_heads):
            raise ValueError(f"tensor_parallel_size {tp} must divide the model's {heads} attention heads and "
                             f"divide or be a multiple of its {kv_heads} key-value heads")
        local = tp // nnodes
        if device.type == "cuda" and local > torch.cuda.device_count():
            raise ValueError(f"{local} ranks per node need {local} GPUs, but {torch.cuda.device_count()} are visible "
                             "(CUDA_VISIBLE_DEVICES)")
        addr = self.master_addr or env.get("MASTER_ADDR") or "127.0.0.1"
        port = self.master_port or (int(env["MASTER_PORT"]) if "MASTER_PORT" in env else None)
        if port is None:
            if nnodes > 1:
                raise ValueError("several nodes need --master-port (and --master-addr, node 0's address)")
            port = _free_port(addr)
        return ParallelConfig(tp, nnodes, node_rank, addr, port, launched)


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    # torchrun started one process per rank: the engine starts none of its own.
    launched_externally: bool = False

    @property
    def ranks_per_node(self) -> int:
        return self.tensor_parallel_size // self.nnodes

    @property
    def init_method(self) -> str:
        return f"tcp://{self.master_addr}:{self.master_port}"


@dataclass
class EngineConfig:
    args: EngineArgs
    source: ModelSource
    hf_config: PretrainedConfig
    device: torch.device
    dtype: torch.dtype
    max_model_len: int
    max_num_batched_tokens: int
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    extra: dict = field(default_factory=dict)
    quant_config: QuantizationConfig | None = None
    kv_cache_dtype: torch.dtype | None = None
    # Set for an embedding model (task "embed"): how its hidden states become an embedding.
    pooler_config: PoolerConfig | None = None

    def __post_init__(self) -> None:
        if self.kv_cache_dtype is None:
            self.kv_cache_dtype = self.dtype

    @property
    def max_num_seqs(self) -> int:
        return self.args.max_num_seqs

    @property
    def block_size(self) -> int:
        return self.args.block_size

    @property
    def async_scheduling(self) -> bool:
        """Embedding steps end with their output: nothing follows them to overlap. Unset, overlap is on where the
        device runs a step asynchronously (a GPU); on the CPU the host would compute the step it schedules
        behind."""
        if self.task == "embed":
            return False
        chosen = self.args.async_scheduling
        return self.device.type == "cuda" if chosen is None else chosen

    @property
    def task(self) -> str:
        return "generate" if self.pooler_config is None else "embed"


def _resolve_dtype(name: str, hf_config: PretrainedConfig, device: torch.device) -> torch.dtype:
    if name != "auto":
        return _DTYPES[name]
    if device.type == "cpu":
        return torch.float32
    config_dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(config_dtype, str):
        config_dtype = _DTYPES.get(config_dtype, torch.float32)
    return config_dtype if config_dtype in (torch.float16, torch.bfloat16) else torch.bfloat16


def _apply_yarn(hf_config: PretrainedConfig, factor: float) -> None:
    """YaRN rope scaling over the model's trained context, which grows `factor` times."""
    from wick.layers.rotary import rope_parameters

    theta, scaling = rope_parameters(hf_config)
    if scaling is not None:
        raise ValueError(f"the model already scales its rope ({scaling['rope_type']}); --yarn-scaling-factor "
                         "applies to models with plain rope")
    original = _max_position(hf_config)
    hf_config.rope_parameters = {"rope_type": "yarn", "factor": float(factor), "rope_theta": theta,
                                 "original_max_position_embeddings": original}
    hf_config.max_position_embeddings = int(original * factor)
    logger.info("YaRN rope scaling x%g: %d -> %d positions", factor, original, hf_config.max_position_embeddings)


def _max_position(hf_config: PretrainedConfig) -> int:
    return int(getattr(hf_config, "max_position_embeddings", None) or 4096)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
