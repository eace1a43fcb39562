"""Executors run the workers of one engine: in this process (one rank) or one process per rank."""

from __future__ import annotations

from wick.config import EngineConfig
from wick.executor.base import Executor


def create_executor(config: EngineConfig) -> Executor:
    if config.parallel.tensor_parallel_size == 1:
        from wick.executor.uniproc import UniprocExecutor

        return UniprocExecutor(config)
    from wick.executor.multiproc import MultiprocExecutor

    return MultiprocExecutor(config)
