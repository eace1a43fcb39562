"""Scheduler: token budget, chunked prefill, admission, preemption and recompute, stops, aborts.

A fake worker keeps its own copy of the requests from the step contract alone (the real InputBatch
of the workers) and a "KV cache" of token ids per (block, slot): it writes the token of each
scheduled position into its copy's block table and reads the whole context back from it, so a
wrong block table or delta in the contract, a bad prefix-cache hit or a block reused while still
in use shows up as a wrong context. Its "sampled" token depends only on that context.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from wick.core.kv_cache_manager import KVCacheManager
from wick.core.request import Request, RequestStatus
from wick.core.sched_output import ModelRunnerOutput, SchedulerOutput
from wick.core.scheduler import Scheduler
from wick.sampling_params import SamplingParams
from wick.worker.input_batch import InputBatch

EOS = 2


def make_request(request_id: str, prompt: list[int], prefill_leader: str | None = None,
                 **params: object) -> Request:
    params.setdefault("eos_token_ids", [EOS])
    return Request(request_id, prompt, SamplingParams(**params), seed=0, prefill_leader=prefill_leader)


def make_scheduler(num_blocks: int = 64, block_size: int = 4, max_num_seqs: int = 16,
                   max_num_batched_tokens: int = 64, max_model_len: int = 64,
                   enable_chunked_prefill: bool = True, enable_prefix_caching: bool = True) -> Scheduler:
    kv = KVCacheManager(num_blocks, block_size, enable_prefix_caching)
    return Scheduler(kv, max_num_seqs, max_num_batched_tokens, max_model_len, enable_chunked_prefill)


def next_token(context: list[int]) -> int:
    return 10 + sum((i + 1) * t for i, t in enumerate(context)) * 7919 % 991


@dataclass
class Item:
    rid: str
    start: int
    num_new_tokens: int
    samples: bool


@dataclass
class Step:
    output: SchedulerOutput
    scheduled: list[Item]

    @property
    def preempted_ids(self) -> list[str]:
        return self.output.preempted_req_ids

    @property
    def finished_ids(self) -> list[str]:
        return self.output.finished_req_ids


class FakeWorker:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.batch = InputBatch()
        self.slots: dict[tuple[int, int], int] = {}

    def execute(self, scheduler: Scheduler, output: SchedulerOutput) -> tuple[ModelRunnerOutput, list[Item]]:
        bs = self.block_size
        scheduled = self.batch.update(output)
        for item in scheduled:
            state = item.state
            # The scheduler may not have seen the tokens of a step in flight yet (overlapped scheduling).
            request = scheduler.requests[state.req_id]
            known = request.all_token_ids
            assert state.token_ids[:len(known)] == known, "the contract lost a token"
            assert len(state.token_ids) - len(known) <= request.num_output_placeholders
            block_ids = self.batch.block_ids(state)
            for p in range(item.start, item.start + item.num_new_tokens):
                self.slots[block_ids[p // bs], p % bs] = state.token_ids[p]
        result = ModelRunnerOutput()
        for item in scheduled:
            state, end = item.state, item.start + item.num_new_tokens
            block_ids = self.batch.block_ids(state)
            context = [self.slots.get((block_ids[p // bs], p % bs)) for p in range(end)]
            assert context == state.token_ids[:end], f"wrong KV context for {state.req_id}"
            if item.samples:
                token = next_token(context)
                state.token_ids.append(token)
                result.req_ids.append(state.req_id)
                result.sampled_token_ids.append(token)
        return result, [Item(i.state.req_id, i.start, i.num_new_tokens, i.samples) for i in scheduled]


def step(scheduler: Scheduler, worker: FakeWorker) -> tuple[Step, list[Request]]:
    output = scheduler.schedule()
    assert output.total_num_scheduled_tokens == sum(output.num_scheduled_tokens.values())
    assert output.total_num_scheduled_tokens <= scheduler.max_num_batched_tokens
    assert len(output.num_scheduled_tokens) <= scheduler.max_num_seqs
    result, items = worker.execute(scheduler, output)
    return Step(output, items), scheduler.update_from_output(output, result)


def run_all(scheduler: Scheduler, requests: list[Request], max_steps: int = 1000) -> list[Step]:
    worker = FakeWorker(scheduler.kv_cache_manager.block_size)
    for request in requests:
        scheduler.add_request(request)
    steps = []
    while scheduler.has_unfinished_requests():
        assert len(steps) < max_steps, "the scheduler made no progress"
        steps.append(step(scheduler, worker)[0])
    kv = scheduler.kv_cache_manager
    assert kv.num_free_blocks == kv.num_blocks, "blocks leaked"
    return steps


def expected_output(prompt: list[int], max_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(next_token(tokens))
    return tokens[len(prompt):]


def prompts(count: int, length: int) -> list[list[int]]:
    return [[100 + 17 * i + j for j in range(length)] for i in range(count)]


def test_token_budget_and_chunks() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=16)
    requests = [make_request(str(i), p, max_tokens=4) for i, p in enumerate(prompts(3, 10))]
    outputs = run_all(scheduler, requests)
    first = outputs[0]
    assert [(s.rid, s.start, s.num_new_tokens, s.samples) for s in first.scheduled] == [
        ("0", 0, 10, True), ("1", 0, 6, False)]
    second = outputs[1]
    assert [(s.rid, s.start, s.num_new_tokens) for s in second.scheduled] == [
        ("0", 10, 1), ("1", 6, 4), ("2", 0, 10)]
    for request, prompt in zip(requests, prompts(3, 10), strict=True):
        assert request.output_token_ids == expected_output(prompt, 4)
        assert request.status is RequestStatus.FINISHED_LENGTH


def test_decode_and_prefill_share_a_step() -> None:
    scheduler = make_scheduler()
    worker = FakeWorker(4)
    a = make_request("a", [5, 6, 7], max_tokens=10)
    scheduler.add_request(a)
    step(scheduler, worker)
    b = make_request("b", [8, 9, 10, 11, 12], max_tokens=10)
    scheduler.add_request(b)
    output, updated = step(scheduler, worker)
    assert [(s.rid, s.start, s.num_new_tokens) for s in output.scheduled] == [("a", 3, 1), ("b", 0, 5)]
    assert updated == [a, b]
    assert a.num_output_tokens == 2 and b.num_output_tokens == 1


def test_chunked_prefill_over_several_steps() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=16)
    prompt = prompts(1, 40)[0]
    request = make_request("a", prompt, max_tokens=3)
    outputs = run_all(scheduler, [request])
    assert [(s.start, s.num_new_tokens, s.samples) for o in outputs for s in o.scheduled] == [
        (0, 16, False), (16, 16, False), (32, 8, True), (40, 1, True), (41, 1, True)]
    assert request.output_token_ids == expected_output(prompt, 3)


def test_without_chunked_prefill_a_prompt_waits_for_budget_and_keeps_its_place() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=20, max_model_len=20, enable_chunked_prefill=False)
    worker = FakeWorker(4)
    a, b = (make_request(n, p, max_tokens=5) for n, p in zip("ab", prompts(2, 12), strict=True))
    c = make_request("c", [1, 3, 4], max_tokens=5)
    for request in (a, b, c):
        scheduler.add_request(request)
    output, _ = step(scheduler, worker)
    assert [s.rid for s in output.scheduled] == ["a"]  # c fits the budget but must not pass b
    output, _ = step(scheduler, worker)
    assert [(s.rid, s.num_new_tokens) for s in output.scheduled] == [("a", 1), ("b", 12), ("c", 3)]

    with pytest.raises(ValueError, match="chunked prefill"):
        make_scheduler(max_num_batched_tokens=16, max_model_len=20, enable_chunked_prefill=False)


def test_waiting_requests_keep_fifo_order_when_blocks_run_out() -> None:
    scheduler = make_scheduler(num_blocks=6, block_size=4)
    worker = FakeWorker(4)
    a = make_request("a", list(range(11, 27)), max_tokens=2)  # 4 blocks, then a fifth for decoding
    b = make_request("b", list(range(30, 39)), max_tokens=2)  # 3 blocks: more than the 2 left
    c = make_request("c", [1, 3], max_tokens=2)  # 1 block: would fit
    for request in (a, b, c):
        scheduler.add_request(request)
    output, _ = step(scheduler, worker)
    assert [s.rid for s in output.scheduled] == ["a"]
    assert scheduler.num_waiting == 2 and scheduler.num_running == 1


def test_max_num_seqs() -> None:
    scheduler = make_scheduler(max_num_seqs=2)
    requests = [make_request(str(i), p, max_tokens=3) for i, p in enumerate(prompts(3, 5))]
    outputs = run_all(scheduler, requests)
    assert max(len(o.scheduled) for o in outputs) == 2
    assert [s.rid for s in outputs[0].scheduled] == ["0", "1"]
    assert all(r.output_token_ids == expected_output(p, 3) for r, p in zip(requests, prompts(3, 5), strict=True))


def test_preemption_of_the_newest_and_recompute_gives_the_same_outputs() -> None:
    lengths = [(6, 20), (9, 14), (5, 22), (7, 12)]
    all_prompts = [[(13 * i + 5 * j) % 97 + 3 for j in range(n)] for i, (n, _) in enumerate(lengths)]

    def make_all() -> list[Request]:
        return [make_request(str(i), p, max_tokens=m)
                for i, (p, (_, m)) in enumerate(zip(all_prompts, lengths, strict=True))]

    roomy = make_scheduler(num_blocks=64)
    reference = make_all()
    run_all(roomy, reference)
    assert roomy.num_preemptions == 0

    tight = make_scheduler(num_blocks=9)
    requests = make_all()
    outputs = run_all(tight, requests)
    assert tight.num_preemptions > 0
    assert sum(r.num_preemptions for r in requests) == tight.num_preemptions
    assert [r.output_token_ids for r in requests] == [r.output_token_ids for r in reference]
    assert all(r.output_token_ids == expected_output(p, m)
               for r, p, (_, m) in zip(requests, all_prompts, lengths, strict=True))

    # The first preemption hit the most recently admitted request, which went to the front of the queue.
    step_index = next(i for i, o in enumerate(outputs) if o.preempted_ids)
    admitted_before = [s.rid for o in outputs[:step_index] for s in o.scheduled if s.start == 0]
    assert outputs[step_index].preempted_ids[0] == admitted_before[-1]


def test_preempted_request_goes_to_the_front_of_waiting() -> None:
    scheduler = make_scheduler(num_blocks=4, block_size=4, max_num_batched_tokens=32)
    worker = FakeWorker(4)
    a = make_request("a", list(range(10, 18)), max_tokens=10)  # 2 blocks, grows to a third
    b = make_request("b", list(range(20, 28)), max_tokens=10)  # 2 blocks
    c = make_request("c", [1, 3, 5], max_tokens=10)
    for request in (a, b, c):
        scheduler.add_request(request)
    output, _ = step(scheduler, worker)
    assert [s.rid for s in output.scheduled] == ["a", "b"]
    output, _ = step(scheduler, worker)  # a needs a third block: b, the newest, is preempted
    assert output.preempted_ids == ["b"]
    assert [s.rid for s in output.scheduled] == ["a"]
    assert b.status is RequestStatus.PREEMPTED and b.num_computed_tokens == 0 and b.block_ids == []
    assert b.num_output_tokens == 1 and b.num_preemptions == 1
    assert list(scheduler.waiting) == [b, c]


def test_a_request_preempts_itself_when_it_is_the_newest() -> None:
    scheduler = make_scheduler(num_blocks=4, block_size=4)
    worker = FakeWorker(4)
    a = make_request("a", list(range(10, 17)), max_tokens=10)  # 7 tokens: its first decode fits 2 blocks
    b = make_request("b", list(range(20, 28)), max_tokens=10)  # 8 tokens: its first decode needs a third
    scheduler.add_request(a)
    scheduler.add_request(b)
    step(scheduler, worker)
    output, _ = step(scheduler, worker)
    assert output.preempted_ids == ["b"]
    assert [s.rid for s in output.scheduled] == ["a"]
    assert list(scheduler.waiting) == [b]


def test_impossible_prompts_are_refused_at_once() -> None:
    scheduler = make_scheduler(num_blocks=4, block_size=4, max_model_len=32)
    with pytest.raises(ValueError, match="prompt has 32 tokens; the model's maximum context is 32 tokens"):
        scheduler.add_request(make_request("a", list(range(32))))
    with pytest.raises(ValueError, match="prompt has 16 tokens; .* cache holds only 4 blocks"):
        scheduler.add_request(make_request("b", list(range(16))))
    scheduler.add_request(make_request("c", list(range(15))))
    with pytest.raises(ValueError, match="already"):
        scheduler.add_request(make_request("c", [1]))
    assert scheduler.num_waiting == 1


def test_a_request_the_size_of_the_cache_stops_instead_of_looping() -> None:
    scheduler = make_scheduler(num_blocks=4, block_size=4, max_model_len=64)
    request = make_request("a", list(range(10, 24)), max_tokens=40)
    run_all(scheduler, [request])
    assert request.status is RequestStatus.FINISHED_LENGTH
    assert request.num_tokens == 17


def test_prefill_leader_is_waited_for_then_hit_in_the_cache() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=8)
    prompt = prompts(1, 18)[0]
    leader = make_request("L", prompt, max_tokens=3)
    follower = make_request("F", prompt, prefill_leader="L", max_tokens=3)
    other = make_request("O", [1, 3, 5], max_tokens=3)
    outputs = run_all(scheduler, [leader, follower, other])
    first_of = {}
    for i, output in enumerate(outputs):
        for s in output.scheduled:
            first_of.setdefault(s.rid, (i, s.start))
    assert first_of["L"] == (0, 0)
    assert first_of["O"][0] == 2  # the follower does not block the queue behind it
    # As soon as the leader has written the 4 full blocks the follower can take (after step 1), from the cache.
    assert first_of["F"] == (2, 16)
    assert follower.num_cached_tokens == 16
    assert follower.output_token_ids == leader.output_token_ids == expected_output(prompt, 3)


def test_without_prefix_caching_there_is_no_leader_to_wait_for() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=8, enable_prefix_caching=False)
    prompt = prompts(1, 18)[0]
    leader = make_request("L", prompt, max_tokens=3)
    follower = make_request("F", prompt, prefill_leader="L", max_tokens=3)
    outputs = run_all(scheduler, [leader, follower])
    assert [s.rid for s in outputs[1].scheduled] == ["L"]
    assert follower.num_cached_tokens == 0
    assert follower.output_token_ids == expected_output(prompt, 3)


def test_aborts_free_blocks_wherever_the_request_is() -> None:
    scheduler = make_scheduler(num_blocks=8, block_size=4, max_num_batched_tokens=12)
    worker = FakeWorker(4)
    a, b, c = (make_request(n, p, max_tokens=20) for n, p in zip("abc", prompts(3, 8), strict=True))
    for request in (a, b, c):
        scheduler.add_request(request)
    step(scheduler, worker)  # a fully and b partly prefilled, c waiting
    assert scheduler.kv_cache_manager.num_free_blocks == 5
    assert scheduler.abort(["b", "c", "nope"]) == [b, c]
    assert b.status is c.status is RequestStatus.FINISHED_ABORTED
    assert b.block_ids == [] and scheduler.kv_cache_manager.num_free_blocks == 6
    assert scheduler.num_waiting == 0 and scheduler.num_running == 1

    output = scheduler.schedule()
    assert output.finished_req_ids == ["b", "c"]
    sampled, _ = worker.execute(scheduler, output)
    scheduler.abort(["a"])  # between schedule() and update_from_output()
    assert scheduler.update_from_output(output, sampled) == []
    assert scheduler.schedule().finished_req_ids == ["a"]
    assert not scheduler.has_unfinished_requests()
    assert scheduler.kv_cache_manager.num_free_blocks == 8
    assert scheduler.abort(["a"]) == []


def drive(request: Request, tokens: list[int], max_model_len: int = 64) -> list[int]:
    """Feeds the given tokens as the model's samples until the request finishes."""
    scheduler = make_scheduler(max_model_len=max_model_len)
    scheduler.add_request(request)
    fed = iter(tokens)
    while scheduler.has_unfinished_requests():
        output = scheduler.schedule()
        rids = list(output.num_scheduled_tokens)
        scheduler.update_from_output(output, ModelRunnerOutput(rids, [next(fed) for _ in rids]))
    assert scheduler.kv_cache_manager.num_free_blocks == scheduler.kv_cache_manager.num_blocks
    return request.output_token_ids


def test_stop_on_eos_and_stop_token_ids() -> None:
    request = make_request("a", [1, 3], max_tokens=10)
    assert drive(request, [5, 6, EOS, 7]) == [5, 6, EOS]
    assert request.status is RequestStatus.FINISHED_STOPPED

    request = make_request("b", [1, 3], max_tokens=10, stop_token_ids=[6])
    assert drive(request, [5, 6, EOS]) == [5, 6]
    assert request.status is RequestStatus.FINISHED_STOPPED

    request = make_request("c", [1, 3], max_tokens=4, ignore_eos=True)
    assert drive(request, [EOS, EOS, EOS, EOS]) == [EOS] * 4
    assert request.status is RequestStatus.FINISHED_LENGTH


def test_min_tokens_holds_back_stops() -> None:
    request = make_request("a", [1, 3], max_tokens=10, min_tokens=2, stop_token_ids=[9])
    assert drive(request, [EOS, 9, 9, 5]) == [EOS, 9, 9]
    assert request.status is RequestStatus.FINISHED_STOPPED


def test_length_limits() -> None:
    request = make_request("a", [1, 3], max_tokens=3)
    assert drive(request, [5, 6, 7, 8]) == [5, 6, 7]
    assert request.status is RequestStatus.FINISHED_LENGTH

    request = make_request("b", [1, 3, 4], max_tokens=None)
    assert drive(request, list(range(10, 20)), max_model_len=6) == [10, 11, 12]
    assert request.status is RequestStatus.FINISHED_LENGTH and request.num_tokens == 6


def test_the_contract_sends_a_request_once_then_only_new_blocks() -> None:
    scheduler = make_scheduler(block_size=4, max_num_batched_tokens=6)
    request = make_request("a", list(range(10, 20)), max_tokens=4)
    scheduler.add_request(request)
    worker = FakeWorker(4)
    first, _ = step(scheduler, worker)
    (new,) = first.output.scheduled_new_reqs
    assert (new.req_id, new.prompt_token_ids, new.block_ids, new.num_computed_tokens) == (
        "a", list(range(10, 20)), request.block_ids[:2], 0)
    assert not first.output.scheduled_cached_reqs and not first.scheduled[0].samples
    second, _ = step(scheduler, worker)
    (cached,) = second.output.scheduled_cached_reqs
    assert not second.output.scheduled_new_reqs
    assert (cached.new_block_ids, cached.num_computed_tokens) == ([request.block_ids[2]], 6)
    assert second.scheduled[0].samples and request.num_output_tokens == 1
    third, _ = step(scheduler, worker)
    assert third.output.scheduled_cached_reqs[0].new_block_ids == []


def overlapped_step(scheduler: Scheduler, worker: FakeWorker, in_flight: tuple | None) -> tuple | None:
    """The engine core's order with overlapped scheduling: step N+1 is scheduled and launched before
    step N's output reaches the scheduler. Returns the step now in flight."""
    output = scheduler.schedule()
    launched = (output, worker.execute(scheduler, output)[0]) if output.num_scheduled_tokens else None
    if in_flight is not None:
        scheduler.update_from_output(*in_flight)
    return launched


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("seed", range(8))
def test_random_workloads_give_the_outputs_of_a_lone_request(seed: int, overlap: bool) -> None:
    import random

    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4, 16])
    max_model_len = 48
    min_blocks = -(-max_model_len // block_size)
    chunked = rng.random() < 0.7
    scheduler = make_scheduler(
        num_blocks=rng.randint(min_blocks, 2 * min_blocks + 4), block_size=block_size,
        max_num_seqs=rng.randint(1, 6), max_num_batched_tokens=rng.randint(8 if chunked else 48, 64),
        max_model_len=max_model_len, enable_chunked_prefill=chunked, enable_prefix_caching=rng.random() < 0.8)
    stems = [[rng.randint(3, 50) for _ in range(rng.randint(1, 20))] for _ in range(3)]
    requests, expected = [], {}
    for i in range(rng.randint(5, 15)):
        prompt = rng.choice(stems) + [rng.randint(3, 50) for _ in range(rng.randint(0, 8))]
        max_tokens = rng.randint(1, max_model_len - len(prompt))
        requests.append(make_request(str(i), prompt, max_tokens=max_tokens))
        expected[str(i)] = expected_output(prompt, max_tokens)
        if rng.random() < 0.3:
            requests.append(make_request(f"{i}.1", prompt, prefill_leader=str(i), max_tokens=max_tokens))
            expected[f"{i}.1"] = expected[str(i)]
    aborted = {r.request_id for r in requests if rng.random() < 0.1}

    worker = FakeWorker(block_size)
    for request in requests:
        scheduler.add_request(request)
    in_flight = None
    for num_steps in range(2000):
        if not scheduler.has_unfinished_requests():
            break
        if overlap:
            in_flight = overlapped_step(scheduler, worker, in_flight)
        else:
            step(scheduler, worker)
        if num_steps == 3:
            scheduler.abort(aborted)
    assert not scheduler.has_unfinished_requests()
    kv = scheduler.kv_cache_manager
    assert kv.num_free_blocks == kv.num_blocks
    for request in requests:
        if request.status is not RequestStatus.FINISHED_ABORTED:
            assert request.output_token_ids == expected[request.request_id]
