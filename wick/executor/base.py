"""What the engine core asks of its workers, whatever runs them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from wick.core.sched_output import GrammarBitmask, ModelRunnerOutput, SchedulerOutput
from wick.worker.worker import Worker


class Executor(ABC):
    worker: Worker | None  # rank 0, in this process

    @abstractmethod
    def collective_rpc(self, method: str, *args: Any) -> Any:
        """Calls `method` of every rank's Worker with `args`; returns rank 0's result."""

    def determine_num_blocks(self) -> int:
        return self.collective_rpc("determine_num_blocks")

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.collective_rpc("initialize_kv_cache", num_blocks)

    def warm_up(self) -> None:
        """Compiles the kernels of eager steps and captures the CUDA graphs, on a GPU (ModelRunner.warm_up)."""
        self.collective_rpc("warm_up")

    def execute_model(self, scheduler_output: SchedulerOutput) -> None:
        """Launches the step on every rank; sample_tokens finishes it."""
        self.collective_rpc("execute_model", scheduler_output)

    def sample_tokens(self, grammar: GrammarBitmask | None) -> ModelRunnerOutput:
        return self.collective_rpc("sample_tokens", grammar)

    def execute_and_sample(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """A whole step without grammar masks: one message to the workers instead of two."""
        return self.collective_rpc("execute_and_sample", scheduler_output)

    def execute_and_sample_async(self, scheduler_output: SchedulerOutput) -> None:
        """Launches a whole step and returns before it finishes; take_output collects it."""
        self.collective_rpc("execute_and_sample_async", scheduler_output)

    def take_output(self) -> ModelRunnerOutput:
        """The output of the oldest step launched and not yet taken, once it is done (rank 0 only: the
        other ranks keep their copies of the requests up to date themselves)."""
        assert self.worker is not None
        return self.worker.take_output()

    @abstractmethod
    def shutdown(self) -> None:
        """Stops every worker; safe to call more than once."""
