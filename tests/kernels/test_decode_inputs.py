"""kernels.decode_inputs against its torch reference (the interpreter on the CPU)."""

from __future__ import annotations

import pytest
import torch

from wick.kernels.decode_inputs import decode_inputs, decode_inputs_torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize(("rows", "num_reqs", "width"), [(1, 1, 1), (4, 3, 5), (16, 9, 300), (8, 0, 0)])
def test_decode_inputs_matches_torch(rows, num_reqs, width):
    device = DEVICE
    g = torch.Generator().manual_seed(rows * 1000 + width)
    samples = torch.randint(0, 50_000, (rows,), generator=g).to(device)
    previous_rows = torch.randint(-1, rows, (rows,), generator=g).to(device)
    ids = torch.randint(0, 50_000, (rows,), generator=g).to(device)
    packed = torch.randint(0, 10_000, (num_reqs * width + 7,), generator=g, dtype=torch.int32).to(device)
    table_shape = torch.tensor([num_reqs, width], dtype=torch.int32, device=device)
    table = torch.full((rows, 320), -1, dtype=torch.int32, device=device)
    want_ids, want_table = ids.clone(), table.clone()
    decode_inputs_torch(want_ids, previous_rows, samples, table_shape, packed, want_table)
    decode_inputs(ids, previous_rows, samples, table_shape, packed, table)
    assert torch.equal(ids, want_ids) and torch.equal(table, want_table)
    assert (want_table[num_reqs:] == -1).all() and (want_table[:, width:] == -1).all()


@pytest.mark.parametrize("rows", [1, 7, 300])
def test_rows_ranked_longest_context_first(rows):
    """Ties (many here: lengths from a small range) keep row order; 300 rows take two passes over the lengths."""
    device = DEVICE
    g = torch.Generator().manual_seed(rows)
    seq_lens = torch.randint(1, 20, (rows,), generator=g, dtype=torch.int32).to(device)
    samples, previous_rows = torch.zeros(rows, dtype=torch.int64, device=device), torch.full((rows,), -1, device=device)
    table_shape = torch.zeros(2, dtype=torch.int32, device=device)
    table, packed = torch.zeros((rows, 1), dtype=torch.int32, device=device), table_shape
    order, want = (torch.full((rows,), -1, dtype=torch.int32, device=device) for _ in range(2))
    decode_inputs(samples.clone(), previous_rows, samples, table_shape, packed, table, seq_lens, order)
    decode_inputs_torch(samples.clone(), previous_rows, samples, table_shape, packed, table, seq_lens, want)
    assert torch.equal(order, want)
    ranked = seq_lens[order.long()]
    assert (ranked[:-1] >= ranked[1:]).all() and sorted(order.tolist()) == list(range(rows))
