"""The scheduler: one token budget per step, shared by decodes and (chunked) prefills.

Running requests come first, oldest first: each gets its next token or its next prompt chunk.
When blocks run out, the most recently admitted running request is preempted: its blocks are
freed and it goes back to the front of the waiting queue, to be recomputed later (mostly from
the prefix cache). Then waiting requests are admitted in arrival order while budget, sequence
slots and blocks last.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from wick.core.kv_cache_manager import KVCacheManager
from wick.core.request import Request, RequestStatus
from wick.core.sched_output import CachedRequestData, ModelRunnerOutput, NewRequestData, SchedulerOutput


class Scheduler:
    def __init__(self, kv_cache_manager: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, enable_chunked_prefill: bool = True) -> None:
        if max_num_seqs < 1 or max_num_batched_tokens < 1 or max_model_len < 2:
            raise ValueError(f"invalid scheduler limits: max_num_seqs={max_num_seqs}, "
                             f"max_num_batched_tokens={max_num_batched_tokens}, max_model_len={max_model_len}")
        if not enable_chunked_prefill and max_num_batched_tokens < max_model_len:
            raise ValueError(f"without chunked prefill, max_num_batched_tokens ({max_num_batched_tokens}) "
                             f"must be at least max_model_len ({max_model_len})")
        self.kv_cache_manager = kv_cache_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.enable_chunked_prefill = enable_chunked_prefill
        # A request longer than the whole cache could never run its next step, even alone.
        self._max_len = min(max_model_len, kv_cache_manager.num_blocks * kv_cache_manager.block_size + 1)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order: the last one is the newest
        self.requests: dict[str, Request] = {}  # every unfinished request, by id
        self.num_preemptions = 0
        self._finished_ids: list[str] = []
        # Requests the workers know, with how many of their blocks they have been sent.
        self._num_blocks_sent: dict[str, int] = {}

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def add_request(self, request: Request) -> None:
        """Queues the request; raises ValueError at once when it can never be served."""
        if request.request_id in self.requests:
            raise ValueError(f"a request with id {request.request_id!r} is already in the engine")
        num_prompt = request.num_prompt_tokens
        # A generation request needs room for one token after its prompt; an embedding request does not.
        if num_prompt + (request.pooling_params is None) > self.max_model_len:
            raise ValueError(f"prompt has {num_prompt} tokens; the model's maximum context is "
                             f"{self.max_model_len} tokens")
        kv = self.kv_cache_manager
        num_blocks = kv.num_blocks_for(num_prompt + 1)
        if num_blocks > kv.num_blocks:
            raise ValueError(f"prompt has {num_prompt} tokens; with one generated token it needs "
                             f"{num_blocks} KV cache blocks of {kv.block_size} tokens, but the cache holds "
                             f"only {kv.num_blocks} blocks ({kv.num_blocks * kv.block_size} tokens)")
        request.status = RequestStatus.WAITING
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def schedule(self) -> SchedulerOutput:
        output = SchedulerOutput(finished_req_ids=self._finished_ids)
        self._finished_ids = []
        budget = self.max_num_batched_tokens
        kv = self.kv_cache_manager

        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            # The tokens in flight finish it: it needs no more steps.
            if request.num_output_placeholders and self._reaches_length(request, request.num_output_placeholders):
                i += 1
                continue
            num_new = min(request.num_tokens + request.num_output_placeholders - request.num_computed_tokens, budget)
            while not kv.allocate_slots(request, num_new):
                victim = self.running.pop()
                self._preempt(victim)
                output.preempted_req_ids.append(victim.request_id)
                if victim is request:
                    break
            else:
                self._add_to_output(output, request, num_new)
                budget -= num_new
                i += 1

        # After a preemption memory is short: admitting more would only preempt again.
        if not output.preempted_req_ids:
            budget = self._admit_waiting(output, budget)
        output.total_num_scheduled_tokens = self.max_num_batched_tokens - budget
        if not output.num_scheduled_tokens:  # no step runs: the workers hear of these with the next one
            self._finished_ids = output.finished_req_ids
        return output

    def _add_to_output(self, output: SchedulerOutput, request: Request, num_new: int) -> None:
        """Puts the request in the step contract (its whole data if the workers do not know it, else
        only its new blocks) and counts its `num_new` tokens as computed."""
        rid = request.request_id
        sent = self._num_blocks_sent.get(rid)
        if sent is None:
            output.scheduled_new_reqs.append(NewRequestData(
                rid, request.prompt_token_ids, list(request.output_token_ids), request.sampling_params,
                request.seed, list(request.block_ids), request.num_computed_tokens, request.pooling_params))
        else:
            output.scheduled_cached_reqs.append(
                CachedRequestData(rid, request.block_ids[sent:], request.num_computed_tokens))
        self._num_blocks_sent[rid] = len(request.block_ids)
        output.num_scheduled_tokens[rid] = num_new
        request.num_computed_tokens += num_new
        if (request.pooling_params is None
                and request.num_computed_tokens == request.num_tokens + request.num_output_placeholders):
            request.num_output_placeholders += 1  # this step samples the request's next token

    def _admit_waiting(self, output: SchedulerOutput, budget: int) -> int:
        kv = self.kv_cache_manager
        admitted: list[Request] = []
        for request in self.waiting:
            if budget == 0 or len(self.running) >= self.max_num_seqs:
                break
            # A request preempted while a step of it was in flight comes back once that token is in.
            if request.num_output_placeholders or self._waits_for_leader(request):
                continue
            computed_blocks, num_cached = kv.get_computed_blocks(request)
            num_new = request.num_tokens - num_cached
            if num_new > budget:
                if not self.enable_chunked_prefill:
                    break
                num_new = budget
            if not kv.allocate_slots(request, num_new, computed_blocks):
                break
            request.num_computed_tokens = num_cached
            if request.num_preemptions == 0:
                request.num_cached_tokens = num_cached
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            admitted.append(request)
            self._add_to_output(output, request, num_new)
            budget -= num_new
        if admitted:
            taken = {id(r) for r in admitted}
            self.waiting = deque(r for r in self.waiting if id(r) not in taken)
        return budget

    def _waits_for_leader(self, request: Request) -> bool:
        """A request whose prompt another unfinished request is prefilling waits until that prefill's
        blocks are in the prefix cache, to find them there instead of computing them twice."""
        kv = self.kv_cache_manager
        if request.prefill_leader is None or not kv.enable_prefix_caching:
            return False
        leader = self.requests.get(request.prefill_leader)
        return leader is not None and kv.num_cached_blocks(leader) < (leader.num_prompt_tokens - 1) // kv.block_size

    def _preempt(self, request: Request) -> None:
        self.kv_cache_manager.free(request)
        self._num_blocks_sent.pop(request.request_id, None)
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           runner_output: ModelRunnerOutput) -> list[Request]:
        """Records a finished step: newly computed blocks, sampled tokens and stops; pooled requests finish.
        Returns the requests that got a new token, finished ones included (pooled ones are not among them)."""
        starts = scheduler_output.starts
        sampled = dict(zip(runner_output.req_ids, runner_output.sampled_token_ids, strict=True))
        updated = []
        any_finished = any_finished_waiting = False
        for rid, num_new in scheduler_output.num_scheduled_tokens.items():
            request = self.requests.get(rid)
            if request is None:  # finished or aborted since the step was scheduled
                continue
            if request.status is RequestStatus.RUNNING:  # not preempted since (its blocks are gone then)
                self.kv_cache_manager.cache_blocks(request, starts[rid] + num_new)
                self.kv_cache_manager.free_out_of_window(request)
            if rid in runner_output.pooler_output:
                self._finish(request, RequestStatus.FINISHED_STOPPED)
                any_finished = True
                continue
            token = sampled.get(rid)
            if token is None:
                continue
            request.num_output_placeholders -= 1
            request.append_output_token(token)
            grammar = request.structured_output
            if grammar is not None and grammar.advance(request.output_token_ids):
                status = RequestStatus.FINISHED_STOPPED
            else:
                status = self._stop_status(request)
            if status is not None:
                any_finished_waiting |= request.status is RequestStatus.PREEMPTED
                self._finish(request, status)
                any_finished = True
            updated.append(request)
        if any_finished:
            self.running = [r for r in self.running if not r.is_finished]
        if any_finished_waiting:
            self.waiting = deque(r for r in self.waiting if not r.is_finished)
        return updated

    def _reaches_length(self, request: Request, num_more: int = 0) -> bool:
        """Whether the request is at its length limit (max_tokens or the context) once `num_more` tokens
        beyond those it has are in."""
        max_tokens = request.sampling_params.max_tokens
        return ((max_tokens is not None and request.num_output_tokens + num_more >= max_tokens)
                or request.num_tokens + num_more >= self._max_len)

    def _stop_status(self, request: Request) -> RequestStatus | None:
        params = request.sampling_params
        token = request.output_token_ids[-1]
        # min_tokens counts the tokens before the stop token.
        if request.num_output_tokens > params.min_tokens and (
                token in params.stop_token_ids or (not params.ignore_eos and token in params.eos_token_ids)):
            return RequestStatus.FINISHED_STOPPED
        if self._reaches_length(request):
            return RequestStatus.FINISHED_LENGTH
        return None

    def abort(self, request_ids: Iterable[str]) -> list[Request]:
        """Finishes the requests as aborted wherever they are; unknown or finished ids are ignored.
        Returns the requests aborted."""
        aborted = [self.requests[rid] for rid in dict.fromkeys(request_ids) if rid in self.requests]
        if not aborted:
            return []
        for request in aborted:
            self._finish(request, RequestStatus.FINISHED_ABORTED)
        self.running = [r for r in self.running if not r.is_finished]
        self.waiting = deque(r for r in self.waiting if not r.is_finished)
        return aborted

    def _finish(self, request: Request, status: RequestStatus) -> None:
        request.status = status
        self.kv_cache_manager.free(request)
        self._num_blocks_sent.pop(request.request_id, None)
        del self.requests[request.request_id]
        self._finished_ids.append(request.request_id)
