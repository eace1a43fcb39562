"""Latent-space MLA over the paged compressed cache against the plain MLA (per-head keys and values,
causal SDPA): prefill, a chunk over cached context and decode, in one packed batch."""

from __future__ import annotations

import torch

from wick.layers.attention.metadata import AttentionMetadata, set_forward_context
from wick.layers.attention.mla import MLAAttention, mla_attention_ref
from wick.layers.attention.torch_backend import TorchAttentionBackend

HEADS, RANK, NOPE, ROPE, V, BLOCK = 4, 32, 16, 8, 24, 4


def _inputs(n: int, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    return (torch.randn(n, HEADS, NOPE, generator=g), torch.randn(n, HEADS, ROPE, generator=g),
            torch.randn(n, RANK, generator=g), torch.randn(n, ROPE, generator=g))


def test_latent_mla_matches_plain_mla() -> None:
    g = torch.Generator().manual_seed(0)
    kv_b = torch.randn(HEADS * (NOPE + V), RANK, generator=g) / RANK**0.5
    scale = (NOPE + ROPE) ** -0.5
    layer = MLAAttention(HEADS, RANK, NOPE, ROPE, V, scale)
    layer.bind_kv_cache([torch.full(s, float("nan")) for s in layer.kv_cache_shapes(40, BLOCK)])
    free = torch.randperm(40, generator=g).tolist()
    seq_lens = [9, 23, 14]
    seqs = [_inputs(n, g) for n in seq_lens]
    tables = [[free.pop() for _ in range(-(-n // BLOCK))] for n in seq_lens]
    # step 1 computes each sequence's first `done` tokens; step 2 the rest (prefill, chunk, decode)
    done = [0, 15, 13]
    outputs: list[list[torch.Tensor]] = [[] for _ in seqs]
    for step in range(2):
        spans = [(0, d) if step == 0 else (d, n) for d, n in zip(done, seq_lens, strict=True)]
        active = [i for i, (a, b) in enumerate(spans) if b > a]
        parts = [[t[spans[i][0]:spans[i][1]] for t in seqs[i]] for i in active]
        starts = [0]
        for i in active:
            starts.append(starts[-1] + spans[i][1] - spans[i][0])
        slots = [tables[i][p // BLOCK] * BLOCK + p % BLOCK for i in active for p in range(*spans[i])]
        width = max(len(t) for t in tables)
        metadata = AttentionMetadata(
            slot_mapping=torch.tensor(slots), query_start_loc=torch.tensor(starts, dtype=torch.int32),
            seq_lens=torch.tensor([spans[i][1] for i in active], dtype=torch.int32),
            block_tables=torch.tensor([tables[i] + [0] * (width - len(tables[i])) for i in active],
                                      dtype=torch.int32),
            max_query_len=max(starts[j + 1] - starts[j] for j in range(len(active))),
            max_seq_len=max(spans[i][1] for i in active), query_start_loc_cpu=starts,
            seq_lens_cpu=[spans[i][1] for i in active])
        batch = [torch.cat([p[k] for p in parts]) for k in range(4)]
        with set_forward_context(metadata, TorchAttentionBackend()):
            out = layer(*batch, kv_b)
        for j, i in enumerate(active):
            outputs[i].append(out[starts[j]:starts[j + 1]])
    for i, seq in enumerate(seqs):
        expected = mla_attention_ref(*seq, kv_b, HEADS, V, scale)
        torch.testing.assert_close(torch.cat(outputs[i]), expected, atol=1e-5, rtol=1e-5)
