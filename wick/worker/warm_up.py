"""Eager steps of made-up requests, run once at start-up so that the kernels a served step can take are compiled
then rather than while requests wait. Triton compiles a kernel once for each set of its compile-time arguments, and
the attention kernel's follow the step: its query tile the step's longest query (a fresh prompt, the tail of a
prompt whose head came from the prefix cache, a few rows of a chunk), whether it splits the keys the batch's size
and its longest context. A step that meets a new set stalls every request for the compile: about a second on an
H200 (docs/benchmarks.md, session 32), where a served run met one in its first second, and its TTFTs grew by it.

The steps write nothing to the KV cache (their slots are -1) and read pages that belong to nobody yet."""

from __future__ import annotations

import torch
from torch import nn

from wick.layers.attention.backend import AttentionBackend
from wick.layers.attention.metadata import AttentionMetadata, set_forward_context

# Query tokens of a request: powers of two, so that every tile a kernel picks from a query length's next power of
# two (up to the largest here, past which prefill tiles stop growing) is met.
QUERY_LENS = (1, 2, 4, 8, 16, 32, 64, 128)
# Requests of one full-length context each: the key splits a step of few requests takes.
SPLIT_BATCHES = (1, 2, 4, 8, 16, 32)
# A lone request's context from here, doubling: the key splits of every count (a split holds at least this many
# keys), where the partial results' merge is compiled for the count's next power of two.
SPLIT_CONTEXT = 128


def warm_up_shapes(max_model_len: int, max_tokens: int, max_reqs: int) -> list[tuple[int, int, int]]:
    """(requests, query tokens each, context each) of the warm-up steps: for each query length a lone fresh prompt
    (a short context: keys not split), then batches of full-length contexts; a lone decode or prefill row over
    contexts of every power of two."""
    query_lens = [q for q in QUERY_LENS if q <= min(max_model_len, max_tokens)]
    shapes = []
    for q in query_lens:
        shapes.append((1, q, q))
        shapes += [(b, q, max_model_len) for b in SPLIT_BATCHES if b * q <= max_tokens and b <= max_reqs]
    context = SPLIT_CONTEXT
    while context < max_model_len:
        shapes += [(1, q, context) for q in query_lens[:2]]
        context *= 2
    return list(dict.fromkeys(shapes))


def warm_up_metadata(reqs: int, query_len: int, context: int, block_size: int, num_blocks: int,
                     device: torch.device) -> tuple[AttentionMetadata, torch.Tensor]:
    """The metadata and positions of `reqs` requests of `query_len` new tokens at the end of `context` tokens each,
    their pages spread over the cache, writing nothing."""
    pages = -(-context // block_size)
    tokens = reqs * query_len
    block_tables = torch.arange(reqs * pages, dtype=torch.int32).remainder_(num_blocks).view(reqs, pages)
    query_start_loc = list(range(0, tokens + 1, query_len))
    metadata = AttentionMetadata(
        slot_mapping=torch.full((tokens,), -1, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(query_start_loc, dtype=torch.int32, device=device),
        seq_lens=torch.full((reqs,), context, dtype=torch.int32, device=device),
        block_tables=block_tables.to(device), max_query_len=query_len, max_seq_len=context,
        query_start_loc_cpu=query_start_loc, seq_lens_cpu=[context] * reqs, block_tables_cpu=block_tables.numpy())
    positions = torch.arange(context - query_len, context, device=device).repeat(reqs)
    return metadata, positions


@torch.inference_mode()
def warm_up_eager_steps(model: nn.Module, backend: AttentionBackend, shapes: list[tuple[int, int, int]],
                        block_size: int, num_blocks: int, device: torch.device, logits: bool = True) -> None:
    """Runs the forward of each shape's step, and the LM head over its requests' last tokens if `logits`."""
    for reqs, query_len, context in shapes:
        metadata, positions = warm_up_metadata(reqs, query_len, context, block_size, num_blocks, device)
        backend.prepare(metadata)
        with set_forward_context(metadata, backend):
            hidden = model(torch.zeros_like(positions), positions)
        if logits:
            model.compute_logits(hidden[query_len - 1::query_len])
