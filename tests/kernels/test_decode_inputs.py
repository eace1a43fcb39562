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
