"""Tensor parallelism: rank 0 in the engine core's process, the node's other ranks in processes of
their own (other nodes start theirs with `wick serve --node-rank R`, torchrun starts every rank).

Each call goes to the workers through the step channel (shared memory on rank 0's node, gloo to other
nodes); the workers run it in the same order as rank 0, and their collectives (NCCL on GPUs) meet
inside the model. A local worker that dies takes the engine core with it: the process exits, so that
the server answers 503 and stops, as for any crashed core; the other workers see rank 0 gone (its
process, or their gloo connection to it) and exit too.
"""

from __future__ import annotations

import atexit
import logging
import os
import subprocess
import threading
from typing import Any

from wick.config import EngineConfig
from wick.executor.base import Executor
from wick.executor.step_channel import StepChannel
from wick.executor.worker_process import SHUTDOWN, start_worker_processes, stop_processes
from wick.worker.worker import Worker

logger = logging.getLogger(__name__)


class MultiprocExecutor(Executor):
    def __init__(self, config: EngineConfig) -> None:
        parallel = config.parallel
        self._closing = threading.Event()
        self.processes: list[subprocess.Popen] = []
        if not parallel.launched_externally:
            self.processes = start_worker_processes(config, [(r, r) for r in range(1, parallel.ranks_per_node)])
            for process in self.processes:
                threading.Thread(target=self._watch, args=(process,), name="wick-rank-watch", daemon=True).start()
            atexit.register(self.shutdown)
        self.worker: Worker | None = None
        self.channel: StepChannel | None = None
        try:
            self.worker = Worker(config, 0, 0, parallel.init_method)
            self.channel = StepChannel(0, parallel)
        except BaseException:
            self.shutdown()
            raise
        logger.info("tensor parallelism over %d ranks on %d node(s)", parallel.tensor_parallel_size, parallel.nnodes)

    def collective_rpc(self, method: str, *args: Any) -> Any:
        self.channel.send((method, args))
        return getattr(self.worker, method)(*args)

    def shutdown(self) -> None:
        if self._closing.is_set():
            return
        self._closing.set()
        if self.channel is not None:
            try:
                self.channel.send((SHUTDOWN, ()))
            except RuntimeError as e:
                logger.warning("could not tell the workers to stop: %s", e)
            self.channel.close()
        if self.worker is not None:
            self.worker.shutdown()
        stop_processes(self.processes)

    def _watch(self, process: subprocess.Popen) -> None:
        code = process.wait()
        if not self._closing.is_set():
            logger.error("a tensor-parallel worker process (pid %d) exited with code %d; the engine stops",
                         process.pid, code)
            stop_processes([p for p in self.processes if p is not process], grace_s=0.0)
            os._exit(1)
