"""The engine core in its own process, driven through CoreClient on the default model."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest

from wick import LLM, EngineArgs, SamplingParams
from wick.engine.core_client import CoreClient, CoreDied, CoreEvent, CoreOutputs, EngineStartupError, RequestError
from wick.engine.protocol import EngineCoreOutput, EngineCoreRequest

ARGS = dict(max_model_len=1024, num_kv_blocks=48)
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


class Events:
    """Collects what the client's receiver thread hands over."""

    def __init__(self) -> None:
        self.queue: queue.Queue[CoreEvent] = queue.Queue()
        self.stats: dict = {}

    def __call__(self, event: CoreEvent) -> None:
        self.queue.put(event)

    def wait_for(self, done: Callable[[CoreEvent], bool], timeout: float = 60.0) -> list[CoreEvent]:
        seen = []
        deadline = time.monotonic() + timeout
        while True:
            event = self.queue.get(timeout=max(deadline - time.monotonic(), 0.01))
            if isinstance(event, CoreOutputs):
                self.stats = event.stats
            seen.append(event)
            if done(event):
                return seen


def _outputs(events: list[CoreEvent], request_id: str) -> list[EngineCoreOutput]:
    return [o for e in events if isinstance(e, CoreOutputs) for o in e.outputs if o.request_id == request_id]


def _finished(request_id: str) -> Callable[[CoreEvent], bool]:
    return lambda e: isinstance(e, CoreOutputs) and any(
        o.request_id == request_id and o.finish_reason is not None for o in e.outputs)


@pytest.fixture(scope="module")
def events() -> Events:
    return Events()


@pytest.fixture(scope="module")
def client(events: Events):
    client = CoreClient(EngineArgs(**ARGS), events)
    yield client
    client.shutdown()


def test_ready_reports_the_cache_and_model(client):
    assert client.info.max_model_len == 1024
    assert client.info.num_kv_blocks == 48
    assert client.info.block_size == 16
    assert client.info.vocab_size == 49152


@pytest.fixture(scope="module")
def llm() -> LLM:
    """The same engine in this process, for the tokens the core process must give."""
    return LLM(**ARGS)


def test_greedy_tokens_match_the_offline_llm(client, events, llm):
    prompt = llm.get_tokenizer().encode("The capital of France is")
    expected = llm.generate({"prompt_token_ids": prompt}, GREEDY)[0].outputs[0].token_ids
    client.add_request(EngineCoreRequest("greedy", prompt, GREEDY))
    outputs = _outputs(events.wait_for(_finished("greedy")), "greedy")
    assert [t for o in outputs for t in o.new_token_ids] == expected
    assert outputs[-1].finish_reason == "length"


def test_steps_that_wait_for_a_held_up_receiver_arrive_merged(llm):
    """While the receiver thread is held up, the core runs ahead; the steps it sent meanwhile reach the callback
    as one CoreOutputs with all of their tokens, the same tokens as step by step."""
    prompt = llm.get_tokenizer().encode("The capital of Italy is")
    expected = llm.generate({"prompt_token_ids": prompt}, GREEDY)[0].outputs[0].token_ids
    events, released = Events(), threading.Event()

    def held_up(event: CoreEvent) -> None:
        released.wait()
        events(event)

    client = CoreClient(EngineArgs(**ARGS), held_up)
    try:
        client.add_request(EngineCoreRequest("held", prompt, GREEDY))
        time.sleep(5.0)  # eight steps of the small model take well under a second
        released.set()
        outputs = _outputs(events.wait_for(_finished("held")), "held")
    finally:
        client.shutdown()
    assert [t for o in outputs for t in o.new_token_ids] == expected
    assert outputs[-1].finish_reason == "length"
    # the first step's message held the thread; the seven after it came together
    assert max(len(o.new_token_ids) for o in outputs) == len(expected) - 1


def test_impossible_prompt_is_an_error_and_the_core_lives_on(client, events):
    client.add_request(EngineCoreRequest("too-long", [1] * 1100, GREEDY))
    error = events.wait_for(lambda e: isinstance(e, RequestError))[-1]
    assert error.request_id == "too-long" and "1100 tokens" in error.message
    client.add_request(EngineCoreRequest("after", [1, 2, 3], GREEDY))
    assert _outputs(events.wait_for(_finished("after")), "after")[-1].finish_reason == "length"
    assert not client.is_dead


def test_abort_frees_the_kv_blocks(client, events):
    params = SamplingParams(temperature=0.0, max_tokens=1000, ignore_eos=True)
    client.add_request(EngineCoreRequest("long", list(range(100, 300)), params))
    events.wait_for(lambda e: isinstance(e, CoreOutputs) and bool(_outputs([e], "long")))
    assert events.stats["kv_cache_usage"] > 0 and events.stats["num_running"] == 1
    client.abort_requests(["long"])
    events.wait_for(lambda e: isinstance(e, CoreOutputs) and e.stats["num_running"] == 0)
    assert events.stats["kv_cache_usage"] == 0.0
    assert events.stats["prefix_cache_queries"] >= 200


def test_missing_model_fails_start_up_with_the_cores_message(tmp_path):
    with pytest.raises(EngineStartupError, match="no-such-model"):
        CoreClient(EngineArgs(model=str(tmp_path / "no-such-model.gguf")), lambda e: None)


def test_shutdown_stops_the_process(client, events):
    pid = client.process.pid
    client.shutdown()
    assert client.is_dead and client.process.exitcode is not None
    assert isinstance(events.wait_for(lambda e: isinstance(e, CoreDied), timeout=5)[-1], CoreDied)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def _gone(pid: int) -> bool:
    """Whether the process has exited (a zombie that nobody reaped counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_core_exits_when_its_parent_is_killed():
    script = ("import sys, time; from wick import EngineArgs; from wick.engine.core_client import CoreClient; "
              f"c = CoreClient(EngineArgs(**{ARGS!r}), lambda e: None); print(c.process.pid, flush=True); "
              "time.sleep(600)")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        core_pid = int(parent.stdout.readline())
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 10
    while not _gone(core_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(core_pid)
