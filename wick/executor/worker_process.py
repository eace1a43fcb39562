"""Worker processes: one tensor-parallel rank each, driven by rank 0 through the step channel.

A worker is started as `python -m wick.executor.worker_process` with its config and rank pickled on
stdin. It exits when rank 0 says so, when rank 0 goes away (its process is gone, or the gloo
connection to another node breaks), or when the process that started it dies.
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import torch

from wick.config import EngineConfig
from wick.executor.step_channel import StepChannel
from wick.worker.worker import Worker

logger = logging.getLogger(__name__)

_PARENT_POLL_S = 0.5
SHUTDOWN = "shutdown"


@dataclass
class WorkerSpec:
    config: EngineConfig
    rank: int
    local_rank: int
    log_level: int


def start_worker_processes(config: EngineConfig, ranks: list[tuple[int, int]]) -> list[subprocess.Popen]:
    """Starts one process per (rank, local rank)."""
    processes = []
    cpu_threads = max(1, (os.cpu_count() or 1) // config.parallel.ranks_per_node)
    for rank, local_rank in ranks:
        env = dict(os.environ, OMP_NUM_THREADS=str(cpu_threads))
        process = subprocess.Popen([sys.executable, "-m", "wick.executor.worker_process"], stdin=subprocess.PIPE,
                                   env=env)
        pickle.dump(WorkerSpec(config, rank, local_rank, logging.getLogger().getEffectiveLevel()), process.stdin)
        process.stdin.close()
        processes.append(process)
    return processes


def run_worker(config: EngineConfig, rank: int, local_rank: int) -> None:
    """Serves rank 0's calls until it sends SHUTDOWN; raises when rank 0 goes away."""
    worker = Worker(config, rank, local_rank, config.parallel.init_method)
    channel = None
    try:
        channel = StepChannel(rank, config.parallel)
        while True:
            method, args = channel.recv()
            if method == SHUTDOWN:
                return
            getattr(worker, method)(*args)
    finally:
        if channel is not None:
            channel.close()
        worker.shutdown()


def run_worker_node(config: EngineConfig) -> int:
    """Runs this node's ranks (a node other than 0) until one of them exits; returns its exit code."""
    parallel = config.parallel
    first = parallel.node_rank * parallel.ranks_per_node
    processes = start_worker_processes(config, [(first + i, i) for i in range(parallel.ranks_per_node)])
    try:
        while True:
            for process in processes:
                code = process.poll()
                if code is not None:
                    return code
            time.sleep(_PARENT_POLL_S)
    finally:
        stop_processes(processes)


def stop_processes(processes: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    """Waits up to `grace_s` for the processes to exit, then terminates, then kills them."""
    deadline = time.monotonic() + grace_s
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.terminate()
    for process in processes:
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _exit_when_orphaned() -> None:
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="wick-parent-watch", daemon=True).start()


def main() -> None:
    spec: WorkerSpec = pickle.load(sys.stdin.buffer)
    _exit_when_orphaned()
    logging.basicConfig(level=spec.log_level, format=f"%(levelname)s %(name)s [rank {spec.rank}]: %(message)s")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    try:
        run_worker(spec.config, spec.rank, spec.local_rank)
    except Exception as e:
        logger.error("rank %d stops: %s", spec.rank, e)
        sys.exit(1)


if __name__ == "__main__":
    main()
