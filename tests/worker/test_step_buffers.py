"""StepBuffers.pack against the inputs written out request by request from the worker's own lists."""

from __future__ import annotations

import random

import torch

from wick.core.sched_output import CachedRequestData, NewRequestData, SchedulerOutput
from wick.sampling_params import SamplingParams
from wick.worker.input_batch import InputBatch
from wick.worker.step_buffers import StepBuffers

BLOCK = 4


def _reference(scheduled, previous_rows, blocks):
    ids, positions, slots, starts, seq_lens, gathers, sample_rows = [], [], [], [0], [], [], []
    for item in scheduled:
        state, start, n = item.state, item.start, item.num_new_tokens
        for p in range(start, start + n):
            if p < len(state.token_ids):
                ids.append(state.token_ids[p])
            else:
                gathers.append((len(ids), previous_rows[state.req_id]))
                ids.append(0)
            positions.append(p)
            slots.append(blocks[state.req_id][p // BLOCK] * BLOCK + p % BLOCK)
        starts.append(starts[-1] + n)
        seq_lens.append(start + n)
        if item.samples:
            sample_rows.append(starts[-1] - 1)
    width = max(len(blocks[item.state.req_id]) for item in scheduled)
    tables = [blocks[item.state.req_id] + [0] * (width - len(blocks[item.state.req_id])) for item in scheduled]
    return ids, positions, slots, starts, seq_lens, tables, gathers, sample_rows


def _check(step, scheduled, previous_rows, blocks, buffers, graph=False):
    """`blocks`: each request's block ids as the test handed them out, the reference's own record. `graph`: packed
    for a decode graph, which takes the pending tokens itself."""
    ids, positions, slots, starts, seq_lens, tables, gathers, sample_rows = _reference(scheduled, previous_rows,
                                                                                       blocks)
    t = len(ids)
    m = step.metadata
    pending = {dst for dst, _ in gathers}  # left for the gather to fill
    assert [x for i, x in enumerate(step.input_ids[:t].tolist()) if i not in pending] == [
        x for i, x in enumerate(ids) if i not in pending]
    assert step.positions[:t].tolist() == positions
    assert m.slot_mapping[:t].tolist() == slots
    assert m.query_start_loc[:len(starts)].tolist() == starts == m.query_start_loc_cpu[:len(starts)]
    assert m.seq_lens[:len(seq_lens)].tolist() == seq_lens == m.seq_lens_cpu[:len(seq_lens)]
    assert m.block_tables.tolist() == tables == m.block_tables_cpu.tolist()
    assert m.max_query_len == max(item.num_new_tokens for item in scheduled)
    assert m.max_seq_len == max(seq_lens)
    padded_t, b = step.input_ids.numel(), m.query_start_loc.numel() - 1
    views = buffers.views(padded_t, b)
    assert views.slot_mapping.data_ptr() == m.slot_mapping.data_ptr()
    assert views.seq_lens.data_ptr() == m.seq_lens.data_ptr()
    previous = views.previous_rows.tolist()
    if graph:
        assert step.gather is None
        assert [(row, source) for row, source in enumerate(previous) if source >= 0] == gathers
    else:
        got_gathers = [] if step.gather is None else list(zip(*(g.tolist() for g in step.gather), strict=True))
        assert got_gathers == gathers and previous == [-1] * b
    if step.logit_rows is None:
        assert sample_rows == list(range(len(scheduled))) and t == len(scheduled)
    else:
        assert step.logit_rows.tolist() == sample_rows
    # a sampling row's draw: its request's temperature and seed, the count of its output tokens so far
    temperature, seeds, steps = views.temperature, views.seeds, views.steps
    for row, item in enumerate(scheduled):
        if item.samples:
            state = item.state
            assert temperature[row] == torch.tensor(state.sampling_params.temperature, dtype=torch.float32)
            assert seeds[row] == state.seed and steps[row] == state.num_output_tokens


def _new(rid, prompt, blocks, computed=0):
    seed = sum(map(ord, rid))
    return NewRequestData(rid, prompt, [], SamplingParams(max_tokens=8, temperature=seed % 7 / 4), seed, blocks,
                          computed)


def test_mixed_prefill_and_decode_with_pending_tokens():
    batch = InputBatch(num_rows=2, num_blocks=2)  # both grow
    buffers = StepBuffers(64, 8, 16, BLOCK, torch.device("cpu"))
    first = SchedulerOutput(scheduled_new_reqs=[_new("a", list(range(10, 19)), [7, 3, 5]),
                                                _new("b", list(range(30, 36)), [1, 9], computed=4)],
                            num_scheduled_tokens={"a": 6, "b": 2})
    blocks = {"a": [7, 3, 5], "b": [1, 9]}
    scheduled = batch.update(first)
    step = buffers.pack(scheduled, batch, {})
    _check(step, scheduled, {}, blocks, buffers)
    assert step.logit_rows.tolist() == [7]  # a's chunk ends inside its prompt; b's prompt is done

    # b's sample is still on the device (overlap): it comes from row 0 of the previous step's samples.
    second = SchedulerOutput(
        scheduled_new_reqs=[_new("c", [1, 2, 3], [11])],
        scheduled_cached_reqs=[CachedRequestData("a", [2, 4, 6, 8], 6), CachedRequestData("b", [], 6)],
        num_scheduled_tokens={"a": 3, "b": 1, "c": 3})
    scheduled = batch.update(second)
    scheduled[1].state.num_pending = 1
    blocks["a"] += [2, 4, 6, 8]
    blocks["c"] = [11]
    step = buffers.pack(scheduled, batch, {"b": 0})
    _check(step, scheduled, {"b": 0}, blocks, buffers)
    assert len(batch.num_blocks) == 4 and batch.block_table.shape[1] >= 7
    assert batch.num_blocks[scheduled[0].state.row] == 7


def test_decode_padded_to_a_graph_batch_and_rows_reused():
    batch = InputBatch(num_rows=4, num_blocks=4)
    buffers = StepBuffers(32, 8, 8, BLOCK, torch.device("cpu"))
    rng = random.Random(0)
    news = [_new(f"r{i}", [rng.randrange(100) for _ in range(5)], [10 + 2 * i, 11 + 2 * i]) for i in range(3)]
    batch.update(SchedulerOutput(scheduled_new_reqs=news, num_scheduled_tokens={d.req_id: 5 for d in news}))
    rows_before = {rid: state.row for rid, state in batch.requests.items()}
    for state in batch.requests.values():
        state.token_ids.append(rng.randrange(100))
    decode = SchedulerOutput(scheduled_cached_reqs=[CachedRequestData(d.req_id, [], 5) for d in news],
                             num_scheduled_tokens={d.req_id: 1 for d in news})
    scheduled = batch.update(decode)
    step = buffers.pack(scheduled, batch, {}, pad_to=(8, 8))
    _check(step, scheduled, {}, {d.req_id: d.block_ids for d in news}, buffers, graph=True)
    assert step.logit_rows is None and step.num_reqs == 3
    m = step.metadata
    assert step.input_ids.numel() == 8 and step.input_ids[3:].tolist() == [0] * 5
    assert m.slot_mapping[3:].tolist() == [-1] * 5 and m.seq_lens[3:].tolist() == [1] * 5
    assert m.query_start_loc.tolist() == list(range(9))
    # what the graph of batch 8 reads: the real rows' draws, then greedy padding
    views = buffers.views(8, 8)
    temperature, seeds, steps = views.temperature, views.seeds, views.steps
    states = [item.state for item in scheduled]
    assert temperature.tolist() == [s.sampling_params.temperature for s in states] + [0.0] * 5
    assert seeds.tolist() == [s.seed for s in states] + [0] * 5
    assert steps.tolist() == [s.num_output_tokens for s in states] + [0] * 5 == [1, 1, 1, 0, 0, 0, 0, 0]
    # a finished request's row goes to the next new one, with its old blocks forgotten
    batch.update(SchedulerOutput(finished_req_ids=["r1"], scheduled_new_reqs=[_new("d", [1, 2], [20])],
                                 num_scheduled_tokens={"d": 2}))
    assert batch.requests["d"].row == rows_before["r1"] and batch.block_ids(batch.requests["d"]) == [20]


def test_decode_graph_step_takes_pending_tokens_and_block_table_on_the_device():
    """A padded decode step leaves the previous step's tokens and its block table to kernels.decode_inputs, which
    the graph runs first: after it, the graph's views hold what the step's requests need."""
    from wick.kernels.decode_inputs import decode_inputs_torch

    batch = InputBatch(num_rows=4, num_blocks=4)
    buffers = StepBuffers(32, 8, 8, BLOCK, torch.device("cpu"))
    news = [_new("x", [5, 6, 7, 8, 9], [3, 8]), _new("y", [1, 2], [4]), _new("z", [7] * 6, [6, 2])]
    batch.update(SchedulerOutput(scheduled_new_reqs=news, num_scheduled_tokens={d.req_id: len(d.prompt_token_ids)
                                                                              for d in news}))
    batch.requests["y"].token_ids.append(42)  # y's token is on the host; x's and z's are still on the device
    for rid in ("x", "z"):
        batch.requests[rid].num_pending = 1
    buffers.samples[:3] = torch.tensor([11, 22, 33])
    decode = SchedulerOutput(scheduled_cached_reqs=[CachedRequestData(d.req_id, [], len(d.prompt_token_ids))
                                                    for d in news],
                             num_scheduled_tokens={"z": 1, "x": 1, "y": 1})
    scheduled = batch.update(decode)
    step = buffers.pack(scheduled, batch, {"x": 2, "z": 0}, pad_to=(4, 4))
    assert step.gather is None
    views = buffers.views(4, 4)
    assert views.previous_rows.tolist() == [0, 2, -1, -1]
    assert views.table_shape.tolist() == [3, 2]
    block_table = torch.full((4, 8), -1, dtype=torch.int32)
    decode_inputs_torch(views.input_ids, views.previous_rows, buffers.samples, views.table_shape,
                        views.packed_table, block_table)
    assert views.input_ids.tolist() == [11, 33, 42, 0]
    assert block_table[:3, :2].tolist() == [[6, 2], [3, 8], [4, 0]]
    assert (block_table[3] == -1).all() and (block_table[:, 2:] == -1).all()
    assert views.seq_lens.tolist() == [7, 6, 3, 1] and views.positions.tolist() == [6, 5, 2, 0]


def test_lone_prefill_padded_to_a_graph_token_count():
    """A prefill graph's step: one request (here past a cached prefix, its last input still on the device) and
    then tokens of no request up to the graph's count; the request's pending token is gathered before the graph
    runs, and kernels.decode_inputs only copies its block table."""
    from wick.kernels.decode_inputs import decode_inputs_torch

    batch = InputBatch(num_rows=2, num_blocks=2)
    buffers = StepBuffers(32, 8, 8, BLOCK, torch.device("cpu"))
    blocks = {"x": [5, 2, 7]}
    batch.update(SchedulerOutput(scheduled_new_reqs=[_new("x", list(range(40, 49)), blocks["x"])],
                                 num_scheduled_tokens={"x": 4}))
    batch.requests["x"].num_pending = 1
    scheduled = batch.update(SchedulerOutput(scheduled_cached_reqs=[CachedRequestData("x", [], 4)],
                                             num_scheduled_tokens={"x": 6}))
    assert scheduled[0].samples
    step = buffers.pack(scheduled, batch, {"x": 3}, pad_to=(16, 1))
    _check(step, scheduled, {"x": 3}, blocks, buffers)
    assert step.input_ids.numel() == 16 and step.num_reqs == 1
    assert step.input_ids[6:].tolist() == step.positions[6:].tolist() == [0] * 10
    m = step.metadata
    assert m.slot_mapping[6:].tolist() == [-1] * 10
    assert m.query_start_loc.tolist() == [0, 6] and m.seq_lens.tolist() == [10]
    assert [g.tolist() for g in step.gather] == [[5], [3]] and step.logit_rows.tolist() == [5]
    views = buffers.views(16, 1)
    assert views.previous_rows.tolist() == [-1] and views.table_shape.tolist() == [1, 3]
    block_table = torch.full((2, 8), -1, dtype=torch.int32)
    ids = views.input_ids.clone()
    decode_inputs_torch(views.input_ids[:1], views.previous_rows, buffers.samples, views.table_shape,
                        views.packed_table, block_table)
    assert block_table[0, :3].tolist() == blocks["x"] and (block_table[1] == -1).all()
    assert torch.equal(views.input_ids, ids)


def test_capture_inputs_give_tokens_to_requests_up_to_the_longest_context():
    buffers = StepBuffers(32, 8, 8, BLOCK, torch.device("cpu"))
    for t, b, max_context, last in ((4, 4, 32, 1), (16, 1, 32, 16), (16, 1, 10, 10)):
        buffers.fill(t, b, max_context)
        views = buffers.views(t, b)
        assert views.query_start_loc.tolist() == [*range(b), b - 1 + last]
        assert views.seq_lens.tolist() == [1] * (b - 1) + [last]
        assert views.slot_mapping.tolist() == [-1] * t and views.previous_rows.tolist() == [-1] * b


def test_every_section_starts_at_a_16_byte_bound_and_none_overlaps():
    """Kernels specialise on their pointers' 16-byte alignment: no step shape may give a section a new one."""
    buffers = StepBuffers(40, 12, 5, BLOCK, torch.device("cpu"))
    base = buffers.data.data_ptr()
    for t in range(1, 41):
        for b in range(1, min(t, 12) + 1):
            views = buffers.views(t, b)
            spans = sorted((v.data_ptr() - base, v.data_ptr() - base + v.numel() * v.element_size())
                           for v in views[:-1])
            assert all(start % 16 == 0 for start, _ in spans), (t, b)
            assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:], strict=False)), (t, b)
            assert views.packed_table.numel() >= b * 5 and (views.packed_table.data_ptr() - base) % 16 == 0
