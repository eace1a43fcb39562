"""One rank, in the engine core's own process."""

from __future__ import annotations

from typing import Any

from wick.config import EngineConfig
from wick.executor.base import Executor
from wick.worker.worker import Worker


class UniprocExecutor(Executor):
    def __init__(self, config: EngineConfig) -> None:
        self.worker = Worker(config)

    def collective_rpc(self, method: str, *args: Any) -> Any:
        return getattr(self.worker, method)(*args)

    def shutdown(self) -> None:
        self.worker.shutdown()
