"""Turns a scheduled batch into flat tensors, runs the model and samples on the device."""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import nn

from wick.config import CPU_KV_CACHE_MEMORY_SHARE, CPU_KV_CACHE_SEQS, EngineConfig, available_memory_bytes
from wick.core.sched_output import GrammarBitmask, ModelRunnerOutput, SchedulerOutput
from wick.distributed.communication import tp_broadcast
from wick.engine.protocol import TokenLogprobs
from wick.layers.attention.metadata import AttentionMetadata, set_forward_context
from wick.layers.attention.selector import get_attention_backend
from wick.layers.quantization.base import quantization_scope
from wick.layers.sampler import LogprobsTensors, Sampler, compute_prompt_logprobs
from wick.loader.weights import load_weights
from wick.models.registry import get_model_class
from wick.worker.cuda_graph import StepGraphs, capture_sizes
from wick.worker.input_batch import CachedRequestState, InputBatch, ScheduledState, build_sampling_metadata
from wick.worker.pooling import PooledBatch, pool_scheduled, run_encoder
from wick.worker.step_buffers import StepBuffers
from wick.worker.warm_up import warm_up_eager_steps, warm_up_shapes

logger = logging.getLogger(__name__)


@dataclass
class _ForwardResult:
    """What execute_model leaves for sample_tokens: the rows that sample, their logits and, from a decode graph,
    the tokens it drew for them."""

    samplers: list[ScheduledState]
    logits: torch.Tensor | None
    prompt_logprobs: dict[str, LogprobsTensors]
    pooled: PooledBatch | None = None
    sampled: torch.Tensor | None = None


@dataclass
class _PendingStep:
    """A launched step: its sampled tokens on their way to the host (on the device they are the step buffers'
    samples, the next step's inputs), readable once `done` has passed."""

    states: list[CachedRequestState] = field(default_factory=list)
    tokens: torch.Tensor | None = None
    logprobs: LogprobsTensors | None = None
    prompt_logprobs: dict[str, LogprobsTensors] = field(default_factory=dict)
    pooled: PooledBatch | None = None
    done: torch.cuda.Event | None = None

    @cached_property
    def row_of(self) -> dict[str, int]:
        """Each sampling request's row in its samples."""
        return {state.req_id: row for row, state in enumerate(self.states)}


class ModelRunner:
    """Keeps the worker's copy of the running requests (updated from the step contract), runs the
    model and samples. A step is execute_model (the forward and the LM head), then launch_sampling (with
    the grammar masks the engine core filled meanwhile), then take_output once the step is done;
    sample_tokens does the last two and waits."""

    def __init__(self, config: EngineConfig, show_progress: bool = True) -> None:
        self.config = config
        self.device = config.device
        self.block_size = config.block_size
        self.show_progress = show_progress
        self.model = self._load_model()
        if self.device.type == "cuda":
            # Imported on first use: Triton fixes at import whether it compiles or interprets its kernels.
            from wick.kernels.pdl import set_release_early

            quantization = config.quant_config
            set_release_early((getattr(self.model, "cfg", None) or config.hf_config).hidden_size,
                              quantization is not None and quantization.int8_activations)
        # every layer that keeps a paged KV cache declares its shapes (Attention; MLA its compressed one)
        self.attention_layers = [m for m in self.model.modules() if hasattr(m, "kv_cache_shapes")]
        max_blocks = -(-config.max_model_len // self.block_size)
        self.input_batch = InputBatch(config.max_num_seqs, max_blocks)
        max_reqs = max(config.max_num_seqs, capture_sizes(config.max_num_seqs)[-1])  # graphs pad past max_num_seqs
        self.buffers = StepBuffers(max(config.max_num_batched_tokens, max_reqs), max_reqs, max_blocks,
                                   self.block_size, self.device)
        self._forward: _ForwardResult | None = None
        self._pending: deque[_PendingStep] = deque()
        self.backend = get_attention_backend(config.args.attention_backend, self.device, config.kv_cache_dtype)
        self.sampler = Sampler()
        self.vocab_size = config.hf_config.vocab_size
        self.num_blocks = 0
        self.step_graphs: StepGraphs | None = None

    def _load_model(self) -> nn.Module:
        cfg = self.config
        model_cls = get_model_class(list(getattr(cfg.hf_config, "architectures", None) or []), cfg.task)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(cfg.dtype)
        try:
            with torch.device(self.device), quantization_scope(cfg.quant_config):
                model = model_cls(cfg.hf_config)
        finally:
            torch.set_default_dtype(previous)
        load_weights(model, cfg.source, seed=cfg.args.seed, show_progress=self.show_progress,
                     quant_config=cfg.quant_config)
        return model.eval()

    def kv_bytes_per_block(self) -> int:
        elem = torch.empty((), dtype=self.config.kv_cache_dtype).element_size()
        return elem * sum(math.prod(shape) for layer in self.attention_layers
                          for shape in layer.kv_cache_shapes(1, self.block_size))

    def determine_num_blocks(self) -> int:
        args = self.config.args
        if args.num_kv_blocks:
            return args.num_kv_blocks
        full_len = -(-self.config.max_model_len // self.block_size)
        if not self.attention_layers:
            # An encoder keeps no KV cache: its blocks are the scheduler's bookkeeping only and cost nothing.
            return full_len * self.config.max_num_seqs
        if args.kv_cache_memory:
            num_blocks = args.kv_cache_memory // self.kv_bytes_per_block()
        elif self.device.type == "cuda":
            num_blocks = self._profile_free_gpu_memory() // self.kv_bytes_per_block()
        else:
            num_blocks = self._cpu_num_blocks(full_len)
        if self.device.type == "cpu":
            num_blocks = min(num_blocks, full_len * self.config.max_num_seqs)
        if num_blocks < 1:
            raise ValueError("no memory is left for the KV cache; lower max_model_len or raise the memory limit")
        return int(num_blocks)

    def _cpu_num_blocks(self, full_len: int) -> int:
        """Room for CPU_KV_CACHE_SEQS full-length sequences, within a share of the available memory."""
        per_block = self.kv_bytes_per_block()
        num_blocks = full_len * CPU_KV_CACHE_SEQS
        available = available_memory_bytes()
        if available is not None:
            num_blocks = min(num_blocks, int(available * CPU_KV_CACHE_MEMORY_SHARE) // per_block)
        num_blocks = min(num_blocks, full_len * self.config.max_num_seqs)
        logger.info("KV cache on CPU: %d blocks, %d tokens, %.0f MiB (%d full-length sequences of %d tokens, at most "
                    "%.0f%% of the available memory; --kv-cache-memory or --mem to choose)", num_blocks,
                    num_blocks * self.block_size, num_blocks * per_block / 2**20, CPU_KV_CACHE_SEQS,
                    self.config.max_model_len, CPU_KV_CACHE_MEMORY_SHARE * 100)
        return num_blocks

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
            if self.config.pooler_config is None:
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
            layer.bind_kv_cache([self.backend.allocate_kv_cache(shape, self.config.kv_cache_dtype, self.device)
                                 for shape in layer.kv_cache_shapes(num_blocks, self.block_size)])

    def warm_up(self) -> None:
        """On a GPU: compiles the kernels of eager steps (wick.worker.warm_up), then captures the decode and prefill
        graphs where the attention backend allows it."""
        cfg = self.config
        if self.device.type != "cuda":
            return
        if self.attention_layers:
            start = time.perf_counter()
            shapes = warm_up_shapes(cfg.max_model_len, cfg.max_num_batched_tokens, cfg.max_num_seqs)
            warm_up_eager_steps(self.model, self.backend, shapes, self.block_size, self.num_blocks, self.device,
                                logits=cfg.pooler_config is None)
            torch.cuda.synchronize(self.device)
            logger.info("warmed up %d eager step shapes in %.1f s", len(shapes), time.perf_counter() - start)
        if cfg.args.enforce_eager or not self.backend.supports_cuda_graph or not getattr(
                self.model, "supports_cuda_graph", True):
            return
        self.step_graphs = StepGraphs(self.model, self.backend, self.buffers, cfg.max_num_seqs, cfg.max_model_len,
                                      self.block_size, self.device)
        self.step_graphs.capture()

    @property
    def num_pending_steps(self) -> int:
        return len(self._pending)

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> None:
        """Applies the step contract and launches the forward (asynchronous on a GPU). A token sampled
        by the previous step and not yet on the host is read from that step's device tensor."""
        scheduled = self.input_batch.update(scheduler_output)
        self._forward = None
        if not scheduled:
            return
        pooler = self.config.pooler_config
        if not self.attention_layers:  # an encoder: whole prompts, no KV cache, nothing sampled
            hidden, query_start = run_encoder(self.model, self.backend, scheduled, self.device)
            self._forward = _ForwardResult([], None, {}, pool_scheduled(pooler, hidden, scheduled, query_start))
            return
        pad_to = self._graph_shape(scheduled)
        previous_rows = self._pending[-1].row_of if self._pending else {}
        step = self.buffers.pack(scheduled, self.input_batch, previous_rows, pad_to)
        if step.gather is not None:
            step.input_ids[step.gather[0]] = self.buffers.samples[step.gather[1]]
        samplers = [item for item in scheduled if item.samples]
        logits = sampled = None
        if pad_to is not None:
            hidden, logits, sampled = self.step_graphs.run(step)
            if len(samplers) < len(scheduled):  # a decode graph's rows are its requests
                logits, sampled = logits[step.logit_rows], sampled[step.logit_rows]
        else:
            self.backend.prepare(step.metadata)
            with set_forward_context(step.metadata, self.backend):
                hidden = self.model(step.input_ids, step.positions)
            if samplers:
                rows = hidden[:len(scheduled)] if step.logit_rows is None else hidden[step.logit_rows]
                logits = self.model.compute_logits(rows)
        query_start = step.metadata.query_start_loc_cpu
        prompt_logprobs = {}
        for i, item in enumerate(scheduled):
            lps = self._prompt_logprobs(item, hidden, query_start[i])
            if lps is not None:
                prompt_logprobs[item.state.req_id] = lps
        pooled = pool_scheduled(pooler, hidden, scheduled, query_start) if pooler is not None else None
        self._forward = _ForwardResult(samplers, logits, prompt_logprobs, pooled, sampled)

    def _graph_shape(self, scheduled: list[ScheduledState]) -> tuple[int, int] | None:
        """The (tokens, requests) of the graph that runs this step, if one does: a decode step's, or that of a lone
        request's prefill step that samples."""
        graphs = self.step_graphs
        if graphs is None:
            return None
        if len(scheduled) <= graphs.max_batch_size and all(item.num_new_tokens == 1 for item in scheduled):
            bs = graphs.batch_size(len(scheduled))
            return bs, bs
        if len(scheduled) == 1 and scheduled[0].samples:
            t = graphs.prefill_size(scheduled[0].num_new_tokens)
            return None if t is None else (t, 1)
        return None

    @torch.inference_mode()
    def launch_sampling(self, grammar: GrammarBitmask | None = None) -> None:
        """Samples the step launched by execute_model and starts copying the results to the host; every
        tensor-parallel rank gets rank 0's tokens. take_output() collects them."""
        forward, self._forward = self._forward, None
        step = _PendingStep()
        if forward is not None:
            states = [item.state for item in forward.samplers]
            if states:
                sampled, logprobs = forward.sampled, None
                if sampled is None or grammar is not None or not all(state.sampling_row.plain for state in states):
                    result = self.sampler(forward.logits,
                                          build_sampling_metadata(states, self.vocab_size, self.device, grammar))
                    sampled, logprobs = result.sampled_token_ids, result.logprobs
                samples = self.buffers.samples[:len(states)]
                if sampled.data_ptr() != samples.data_ptr():
                    samples.copy_(sampled)
                step.tokens = _to_host(tp_broadcast(samples))
                step.states = states
                for state in states:
                    state.num_pending += 1
                if logprobs is not None:
                    step.logprobs = _logprobs_to_host(logprobs)
            step.prompt_logprobs = {rid: _logprobs_to_host(t) for rid, t in forward.prompt_logprobs.items()}
            step.pooled = forward.pooled
        if self.device.type == "cuda":
            step.done = torch.cuda.Event()
            step.done.record()
        self._pending.append(step)

    def take_output(self) -> ModelRunnerOutput:
        """Waits for the oldest launched step and returns its output; its tokens join the requests."""
        step = self._pending.popleft()
        if step.done is not None:
            step.done.synchronize()
        output = ModelRunnerOutput()
        if step.tokens is not None:
            token_ids = step.tokens.tolist()
            for state, token in zip(step.states, token_ids, strict=True):
                state.token_ids.append(token)
                state.num_pending -= 1
            output.req_ids = [state.req_id for state in step.states]
            output.sampled_token_ids = token_ids
            if step.logprobs is not None:
                per_row = _rows(step.logprobs)
                for row, state in enumerate(step.states):
                    k = state.sampling_params.logprobs
                    if k is not None:
                        ids, lps, rank = per_row[row]
                        output.logprobs[state.req_id] = (ids[: k + 1], lps[: k + 1], rank)
        output.prompt_logprobs = {rid: _rows(t) for rid, t in step.prompt_logprobs.items()}
        if step.pooled is not None:
            output.pooler_output = step.pooled.outputs()
        return output

    def sample_tokens(self, grammar: GrammarBitmask | None = None) -> ModelRunnerOutput:
        """Samples the step launched by execute_model and waits for it (and any step before it)."""
        self.launch_sampling(grammar)
        while len(self._pending) > 1:
            self.take_output()
        return self.take_output()

    def _prompt_logprobs(self, item: ScheduledState, hidden: torch.Tensor, offset: int) -> LogprobsTensors | None:
        """Logprobs of the prompt tokens that positions start .. of this chunk predict (1 .. P-1 in all)."""
        state = item.state
        k = state.sampling_params.prompt_logprobs
        if k is None:
            return None
        first, last = item.start, min(item.start + item.num_new_tokens, state.num_prompt_tokens - 1)
        if first >= last:
            return None
        logits = self.model.compute_logits(hidden[offset:offset + last - first]).float()
        targets = self._to_device(state.prompt_token_ids[first + 1:last + 1], torch.long)
        return compute_prompt_logprobs(logits, targets, k)

    def _to_device(self, values: list, dtype: torch.dtype) -> torch.Tensor:
        tensor = torch.tensor(values, dtype=dtype, pin_memory=self.device.type == "cuda")
        return tensor.to(self.device, non_blocking=True)


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """Starts copying a device tensor to the host; read it after the step's event. A copy on the CPU as well: the
    step buffers' samples are overwritten by the next step."""
    if t.device.type == "cpu":
        return t.clone()
    return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)


def _logprobs_to_host(t: LogprobsTensors) -> LogprobsTensors:
    return LogprobsTensors(_to_host(t.token_ids), _to_host(t.logprobs), _to_host(t.ranks))


def _rows(t: LogprobsTensors) -> list[TokenLogprobs]:
    ids, lps, ranks = t.token_ids.tolist(), t.logprobs.tolist(), t.ranks.tolist()
    return list(zip(ids, lps, ranks, strict=True))
