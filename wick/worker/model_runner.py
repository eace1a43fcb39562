"""Turns a scheduled batch into flat tensors, runs the model and samples on the device."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from torch import nn

from wick.config import CPU_KV_CACHE_BYTES, EngineConfig
from wick.core.scheduler import SchedulerOutput
from wick.core.structured_output import StructuredOutputManager
from wick.engine.request import Request
from wick.layers.attention.layer import Attention
from wick.layers.attention.metadata import AttentionMetadata, set_forward_context
from wick.layers.attention.selector import get_attention_backend
from wick.layers.quantization.base import quantization_scope
from wick.layers.sampler import LogprobsTensors, Sampler, SamplingMetadata, compute_prompt_logprobs
from wick.loader.weights import load_weights
from wick.models.registry import get_model_class
from wick.worker.cuda_graph import DecodeGraphs

logger = logging.getLogger(__name__)

# (token ids, logprobs, rank of the first id): the chosen token first, then the top-N alternatives.
TokenLogprobs = tuple[list[int], list[float], int]


@dataclass
class ModelRunnerOutput:
    sampled_token_ids: dict[str, int] = field(default_factory=dict)
    logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)
    # Prompt logprobs computed this step, per request: one entry per prompt position predicted.
    prompt_logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)


class ModelRunner:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = config.device
        self.block_size = config.block_size
        self.model = self._load_model()
        self.attention_layers = [m for m in self.model.modules() if isinstance(m, Attention)]
        self.backend = get_attention_backend(config.args.attention_backend, self.device, config.kv_cache_dtype)
        self.sampler = Sampler()
        self.vocab_size = config.hf_config.vocab_size
        self.num_blocks = 0
        self.decode_graphs: DecodeGraphs | None = None

    def _load_model(self) -> nn.Module:
        cfg = self.config
        model_cls = get_model_class(list(getattr(cfg.hf_config, "architectures", None) or []))
        previous = torch.get_default_dtype()
        torch.set_default_dtype(cfg.dtype)
        try:
            with torch.device(self.device), quantization_scope(cfg.quant_config):
                model = model_cls(cfg.hf_config)
        finally:
            torch.set_default_dtype(previous)
        load_weights(model, cfg.source, seed=cfg.args.seed, quant_config=cfg.quant_config)
        return model.eval()

    def kv_bytes_per_block(self) -> int:
        layer = self.attention_layers[0]
        elem = torch.empty((), dtype=self.config.kv_cache_dtype).element_size()
        per_layer = 2 * self.block_size * layer.num_kv_heads * layer.head_dim * elem
        return per_layer * len(self.attention_layers)

    def determine_num_blocks(self) -> int:
        args = self.config.args
        if args.num_kv_blocks:
            return args.num_kv_blocks
        if args.kv_cache_memory:
            budget = args.kv_cache_memory
        elif self.device.type == "cuda":
            budget = self._profile_free_gpu_memory()
        else:
            budget = CPU_KV_CACHE_BYTES
        num_blocks = budget // self.kv_bytes_per_block()
        full_len = -(-self.config.max_model_len // self.block_size)
        if self.device.type == "cpu":
            num_blocks = min(num_blocks, full_len * self.config.max_num_seqs)
        if num_blocks < 1:
            raise ValueError("no memory is left for the KV cache; lower max_model_len or raise the memory limit")
        return int(num_blocks)

    def _profile_free_gpu_memory(self) -> int:
        """Free memory for the KV cache after a forward pass of the largest batch the scheduler makes."""
        n = self.config.max_num_batched_tokens
        num_blocks = -(-n // self.block_size)
        self.initialize_kv_cache(num_blocks)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        metadata = AttentionMetadata(
            slot_mapping=torch.arange(n, device=self.device),
            query_start_loc=torch.tensor([0, n], dtype=torch.int32, device=self.device),
            seq_lens=torch.tensor([n], dtype=torch.int32, device=self.device),
            block_tables=torch.arange(num_blocks, dtype=torch.int32, device=self.device)[None],
            max_query_len=n, max_seq_len=n, query_start_loc_cpu=[0, n], seq_lens_cpu=[n],
            block_tables_cpu=[list(range(num_blocks))])
        positions = torch.arange(n, device=self.device) % self.config.max_model_len
        self.backend.prepare(metadata)
        with torch.inference_mode(), set_forward_context(metadata, self.backend):
            hidden = self.model(torch.zeros_like(positions), positions)
            self.model.compute_logits(hidden[: self.config.max_num_seqs])
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        cache_bytes = num_blocks * self.kv_bytes_per_block()
        self.initialize_kv_cache(0)
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(self.device).total_memory
        return int(total * self.config.args.gpu_memory_utilization - (peak - cache_bytes))

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        for layer in self.attention_layers:
            shape = (num_blocks, self.block_size, layer.num_kv_heads, layer.head_dim)
            layer.k_cache = torch.zeros(shape, dtype=self.config.kv_cache_dtype, device=self.device)
            layer.v_cache = torch.zeros(shape, dtype=self.config.kv_cache_dtype, device=self.device)

    def capture_cuda_graphs(self) -> None:
        """Captures decode graphs when the device and the attention backend allow it."""
        cfg = self.config
        if self.device.type != "cuda" or cfg.args.enforce_eager or not self.backend.supports_cuda_graph:
            return
        self.decode_graphs = DecodeGraphs(self.model, self.backend, cfg.max_num_seqs, cfg.max_model_len,
                                          self.block_size, self.device)
        self.decode_graphs.capture()

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput,
                      structured_output: StructuredOutputManager | None = None) -> ModelRunnerOutput:
        scheduled = scheduler_output.scheduled
        if not scheduled:
            return ModelRunnerOutput()
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_start = [0]
        seq_lens: list[int] = []
        bs = self.block_size
        for item in scheduled:
            req, start, n = item.request, item.start, item.num_new_tokens
            input_ids.extend(req.all_token_ids[start:start + n])
            positions.extend(range(start, start + n))
            slots.extend(req.block_ids[p // bs] * bs + p % bs for p in range(start, start + n))
            query_start.append(query_start[-1] + n)
            seq_lens.append(start + n)
        max_blocks = max(len(item.request.block_ids) for item in scheduled)
        tables = [item.request.block_ids + [0] * (max_blocks - len(item.request.block_ids)) for item in scheduled]

        to_device = self._to_device
        metadata = AttentionMetadata(
            slot_mapping=to_device(slots, torch.long),
            query_start_loc=to_device(query_start, torch.int32),
            seq_lens=to_device(seq_lens, torch.int32),
            block_tables=to_device(tables, torch.int32),
            max_query_len=max(item.num_new_tokens for item in scheduled),
            max_seq_len=max(seq_lens), query_start_loc_cpu=query_start, seq_lens_cpu=seq_lens,
            block_tables_cpu=tables)
        graphs = self.decode_graphs
        if graphs is not None and metadata.max_query_len == 1 and len(scheduled) <= graphs.max_batch_size:
            hidden = graphs.run(to_device(input_ids, torch.long), to_device(positions, torch.long), metadata)
        else:
            self.backend.prepare(metadata)
            with set_forward_context(metadata, self.backend):
                hidden = self.model(to_device(input_ids, torch.long), to_device(positions, torch.long))

        output = ModelRunnerOutput()
        samplers = [(i, item.request) for i, item in enumerate(scheduled) if item.samples]
        if samplers:
            rows = to_device([query_start[i + 1] - 1 for i, _ in samplers], torch.long)
            logits = self.model.compute_logits(hidden[rows]).float()
            requests = [req for _, req in samplers]
            # On a GPU the forward above is still running: the grammar masks fill on the CPU meanwhile.
            grammar = structured_output.fill_bitmask(requests) if structured_output is not None else None
            sampling_metadata = SamplingMetadata.from_requests(
                requests, self.vocab_size, self.device,
                (grammar.rows, grammar.bitmask) if grammar is not None else None)
            result = self.sampler(logits, sampling_metadata)
            token_ids = result.sampled_token_ids.tolist()
            output.sampled_token_ids = {req.request_id: t for req, t in zip(requests, token_ids, strict=True)}
            if result.logprobs is not None:
                per_row = _rows(result.logprobs)
                for row, req in enumerate(requests):
                    k = req.sampling_params.logprobs
                    if k is not None:
                        ids, lps, rank = per_row[row]
                        output.logprobs[req.request_id] = (ids[: k + 1], lps[: k + 1], rank)
        for i, item in enumerate(scheduled):
            lps = self._prompt_logprobs(item.request, item.start, item.num_new_tokens, hidden, query_start[i])
            if lps:
                output.prompt_logprobs[item.request.request_id] = lps
        return output

    def _prompt_logprobs(self, req: Request, start: int, n: int, hidden: torch.Tensor,
                         offset: int) -> list[TokenLogprobs]:
        """Logprobs of prompt tokens 1..P-1 predicted by positions 0..P-2 inside this chunk."""
        k = req.sampling_params.prompt_logprobs
        if k is None:
            return []
        # After preemption the prompt is computed again: skip positions already reported.
        first = max(start, len(req.prompt_logprobs))
        last = min(start + n, req.num_prompt_tokens - 1)
        if first >= last:
            return []
        rows = hidden[offset + first - start: offset + last - start]
        logits = self.model.compute_logits(rows).float()
        targets = self._to_device(req.prompt_token_ids[first + 1:last + 1], torch.long)
        return _rows(compute_prompt_logprobs(logits, targets, k))

    def _to_device(self, values: list, dtype: torch.dtype) -> torch.Tensor:
        tensor = torch.tensor(values, dtype=dtype, pin_memory=self.device.type == "cuda")
        return tensor.to(self.device, non_blocking=True)


def _rows(t: LogprobsTensors) -> list[TokenLogprobs]:
    ids, lps, ranks = t.token_ids.tolist(), t.logprobs.tolist(), t.ranks.tolist()
    return list(zip(ids, lps, ranks, strict=True))
