"""What sending one step to the other rank costs on the CPU (TP=2: rank 0 and one worker process): the
gloo `broadcast_object_list` the workers used to wait in, against the shared-memory ring
(wick/distributed/shm_broadcast.py). Messages are the executor's real ones, `("execute_and_sample",
(SchedulerOutput,))`: one request decoding, 256 requests decoding, and 256 new requests of 512 prompt
tokens arriving at once (a message of several ring slots).

Per message and channel, in microseconds: rank 0's time in the send call; the round trip (send, the
worker unpickles it and answers with a one-byte message back over the same channel); one way, estimated
as the round trip less half the round trip of an empty message. Also the pickle (protocol 5) cost.

    python -m benchmarks.step_broadcast [--iterations 2000]
"""

from __future__ import annotations

import argparse
import multiprocessing
import pickle
import socket
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from wick.core.sched_output import CachedRequestData, NewRequestData, SchedulerOutput
from wick.distributed.shm_broadcast import RingHandle, ShmBroadcast
from wick.sampling_params import SamplingParams

_STOP = "stop"


def decode_step(num_reqs: int) -> tuple[str, tuple[SchedulerOutput]]:
    """`num_reqs` running requests decode one token each; one in 16 gets a new block this step."""
    cached = [CachedRequestData(f"cmpl-{i:08x}-0", [1000 + i] if i % 16 == 0 else [], 300 + i)
              for i in range(num_reqs)]
    out = SchedulerOutput(scheduled_cached_reqs=cached, num_scheduled_tokens={c.req_id: 1 for c in cached},
                          total_num_scheduled_tokens=num_reqs)
    return "execute_and_sample", (out,)


def prefill_step(num_reqs: int, prompt_len: int) -> tuple[str, tuple[SchedulerOutput]]:
    new = [NewRequestData(f"cmpl-{i:08x}-0", [(i * 7919 + j * 104729) % 128000 for j in range(prompt_len)], [],
                          SamplingParams(temperature=0.0, max_tokens=512), i, list(range(i * 32, i * 32 + 32)), 0)
           for i in range(num_reqs)]
    out = SchedulerOutput(scheduled_new_reqs=new, num_scheduled_tokens={r.req_id: prompt_len for r in new},
                          total_num_scheduled_tokens=num_reqs * prompt_len)
    return "execute_and_sample", (out,)


def _worker_shm(handle: RingHandle, acks: multiprocessing.Queue) -> None:
    ring = ShmBroadcast.attach(handle, 0)
    back = ShmBroadcast.create(1)
    acks.put(back.handle)
    while ring.recv() != _STOP:
        back.send(1)
    back.close()
    ring.close()


def _worker_gloo(init_method: str) -> None:
    dist.init_process_group("gloo", init_method=init_method, rank=1, world_size=2)
    while True:
        message = [None]
        dist.broadcast_object_list(message, src=0)
        if message[0] == _STOP:
            break
        dist.broadcast_object_list([1], src=1)
    dist.destroy_process_group()


def _time(send: Callable[[Any], None], wait_ack: Callable[[], None], message: Any,
          iterations: int) -> tuple[float, float]:
    """Mean seconds in the send call and of the whole round trip."""
    for _ in range(min(50, iterations)):
        send(message)
        wait_ack()
    in_send = total = 0.0
    for _ in range(iterations):
        start = time.perf_counter()
        send(message)
        sent = time.perf_counter()
        wait_ack()
        end = time.perf_counter()
        in_send += sent - start
        total += end - start
    return in_send / iterations, total / iterations


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=2000)
    args = parser.parse_args()
    messages = {"empty": ("", ()), "decode, 1 request": decode_step(1), "decode, 256 requests": decode_step(256),
                "prefill, 256 new requests x 512 tokens": prefill_step(256, 512)}
    print(f"{'message':<40} {'bytes':>10} {'dumps us':>9} {'loads us':>9}")
    for name, message in messages.items():
        data = pickle.dumps(message, protocol=5)
        n = max(10, args.iterations // (100 if len(data) > 1 << 20 else 1))
        start = time.perf_counter()
        for _ in range(n):
            pickle.dumps(message, protocol=5)
        dumps = (time.perf_counter() - start) / n
        start = time.perf_counter()
        for _ in range(n):
            pickle.loads(data)
        loads = (time.perf_counter() - start) / n
        print(f"{name:<40} {len(data):>10,} {dumps * 1e6:>9.1f} {loads * 1e6:>9.1f}")

    ctx = multiprocessing.get_context("spawn")
    results: dict[str, dict[str, tuple[float, float]]] = {}

    ring = ShmBroadcast.create(1)
    acks = ctx.Queue()
    worker = ctx.Process(target=_worker_shm, args=(ring.handle, acks))
    worker.start()
    back = ShmBroadcast.attach(acks.get(timeout=120), 0)
    for name, message in messages.items():
        n = args.iterations // (20 if name.startswith("prefill") else 1)
        results.setdefault(name, {})["shm"] = _time(ring.send, back.recv, message, n)
    ring.send(_STOP)
    worker.join()
    back.close()
    ring.close()

    init_method = f"tcp://127.0.0.1:{_free_port()}"
    worker = ctx.Process(target=_worker_gloo, args=(init_method,))
    worker.start()
    dist.init_process_group("gloo", init_method=init_method, rank=0, world_size=2)
    send = lambda m: dist.broadcast_object_list([m], src=0)  # noqa: E731
    wait_ack = lambda: dist.broadcast_object_list([None], src=1)  # noqa: E731
    for name, message in messages.items():
        n = args.iterations // (20 if name.startswith("prefill") else 1)
        results[name]["gloo"] = _time(send, wait_ack, message, n)
    send(_STOP)
    worker.join()
    dist.destroy_process_group()

    print(f"\n{'message':<40} {'channel':<6} {'in send us':>10} {'round trip us':>13} {'one way us':>10}")
    for name, by_channel in results.items():
        for channel, (in_send, round_trip) in by_channel.items():
            one_way = round_trip - results["empty"][channel][1] / 2
            print(f"{name:<40} {channel:<6} {in_send * 1e6:>10.1f} {round_trip * 1e6:>13.1f} {one_way * 1e6:>10.1f}")


if __name__ == "__main__":
    main()
