"""One rank: its device, its place in the tensor-parallel group, and its model runner."""

from __future__ import annotations

import dataclasses
import logging

import torch
import torch.distributed as dist

from wick.config import EngineConfig
from wick.core.sched_output import GrammarBitmask, ModelRunnerOutput, SchedulerOutput
from wick.distributed.parallel_state import control_group, destroy_distributed, init_distributed
from wick.worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class Worker:
    """`init_method` (a torch.distributed address) is needed when the config has more than one rank."""

    def __init__(self, config: EngineConfig, rank: int = 0, local_rank: int = 0,
                 init_method: str | None = None) -> None:
        self.rank = rank
        self.world_size = config.parallel.tensor_parallel_size
        device = config.device
        if device.type == "cuda":
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
            config = dataclasses.replace(config, device=device)
        if self.world_size > 1:
            if init_method is None:
                raise ValueError("a tensor-parallel worker needs the address of its process group")
            init_distributed(rank, self.world_size, config.parallel.ranks_per_node, init_method, device)
        self.runner = ModelRunner(config, show_progress=rank == 0)

    def determine_num_blocks(self) -> int:
        """The KV blocks every rank has room for."""
        num_blocks = self.runner.determine_num_blocks()
        if self.world_size > 1:
            value = torch.tensor([num_blocks])
            dist.all_reduce(value, op=dist.ReduceOp.MIN, group=control_group())
            num_blocks = int(value.item())
        return num_blocks

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.runner.initialize_kv_cache(num_blocks)

    def warm_up(self) -> None:
        self.runner.warm_up()

    def execute_model(self, scheduler_output: SchedulerOutput) -> None:
        self.runner.execute_model(scheduler_output)

    def sample_tokens(self, grammar: GrammarBitmask | None) -> ModelRunnerOutput:
        return self.runner.sample_tokens(grammar)

    def execute_and_sample(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """A step without grammar masks, in one call."""
        self.runner.execute_model(scheduler_output)
        return self.runner.sample_tokens(None)

    def execute_and_sample_async(self, scheduler_output: SchedulerOutput) -> None:
        self.runner.execute_model(scheduler_output)
        self.runner.launch_sampling()
        if self.rank != 0:
            # Nobody takes this rank's outputs: it settles its own steps, all but the one just launched.
            while self.runner.num_pending_steps > 1:
                self.runner.take_output()

    def take_output(self) -> ModelRunnerOutput:
        return self.runner.take_output()

    def shutdown(self) -> None:
        if self.world_size > 1:
            destroy_distributed()
