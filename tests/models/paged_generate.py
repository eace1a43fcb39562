"""Test helper: drives a model through the paged KV cache the way the model runner does.

Blocks are handed out from a shuffled free list, so block tables are not contiguous.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from wick.layers.attention.backend import AttentionBackend
from wick.layers.attention.metadata import AttentionMetadata, set_forward_context
from wick.layers.attention.torch_backend import TorchAttentionBackend


@dataclass
class Sequence:
    token_ids: list[int]
    block_ids: list[int] = field(default_factory=list)
    num_computed: int = 0


class PagedRunner:
    def __init__(self, model: nn.Module, num_blocks: int = 256, block_size: int = 4, seed: int = 0,
                 backend: AttentionBackend | None = None) -> None:
        self.model = model
        self.block_size = block_size
        for module in model.modules():
            if hasattr(module, "kv_cache_shapes"):
                module.bind_kv_cache([torch.zeros(s) for s in module.kv_cache_shapes(num_blocks, block_size)])
        self.free_blocks = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
        self.backend = backend or TorchAttentionBackend()

    def step(self, work: list[tuple[Sequence, int]]) -> list[torch.Tensor]:
        """Runs the next n tokens of each (sequence, n) as one packed batch; returns each one's logits [n, vocab]."""
        input_ids, positions, slots, query_start, seq_lens = [], [], [], [0], []
        for seq, n in work:
            start, end = seq.num_computed, seq.num_computed + n
            while len(seq.block_ids) * self.block_size < end:
                seq.block_ids.append(self.free_blocks.pop())
            input_ids += seq.token_ids[start:end]
            positions += range(start, end)
            slots += [seq.block_ids[p // self.block_size] * self.block_size + p % self.block_size
                      for p in range(start, end)]
            query_start.append(query_start[-1] + n)
            seq_lens.append(end)
            seq.num_computed = end
        width = max(len(seq.block_ids) for seq, _ in work)
        block_tables = [seq.block_ids + [0] * (width - len(seq.block_ids)) for seq, _ in work]
        metadata = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            query_start_loc=torch.tensor(query_start, dtype=torch.int32),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            block_tables=torch.tensor(block_tables, dtype=torch.int32),
            max_query_len=max(n for _, n in work),
            max_seq_len=max(seq_lens),
            query_start_loc_cpu=query_start,
            seq_lens_cpu=seq_lens,
        )
        with torch.inference_mode(), set_forward_context(metadata, self.backend):
            hidden = self.model(torch.tensor(input_ids), torch.tensor(positions))
            logits = self.model.compute_logits(hidden)
        return list(logits.split([n for _, n in work]))

    def generate(self, prompts: list[list[int]], max_new_tokens: int) -> list[tuple[list[int], torch.Tensor]]:
        """Greedy decoding of all prompts in one batch: a prefill step, then one-token decode steps.

        Returns, per prompt, the new tokens and the logits that chose them [max_new_tokens, vocab].
        """
        seqs = [Sequence(list(p)) for p in prompts]
        steps: list[list[torch.Tensor]] = [[] for _ in seqs]
        work = [(seq, len(seq.token_ids)) for seq in seqs]
        for _ in range(max_new_tokens):
            for seq, logits, chosen in zip(seqs, self.step(work), steps, strict=True):
                chosen.append(logits[-1])
                seq.token_ids.append(int(logits[-1].argmax()))
            work = [(seq, 1) for seq in seqs]
        return [
            (seq.token_ids[len(p) :], torch.stack(chosen))
            for seq, p, chosen in zip(seqs, prompts, steps, strict=True)
        ]
