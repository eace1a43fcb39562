"""The process groups of one engine: every rank of the tensor-parallel group (NCCL on GPUs, gloo on
CPUs), and a gloo group beside it over which the engine core sends each step to the workers."""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

# A worker waits in the control group for the next step for as long as the server stays idle.
_CONTROL_TIMEOUT = timedelta(days=365)
_control_group: dist.ProcessGroup | None = None


def init_distributed(rank: int, world_size: int, init_method: str, backend: str) -> None:
    """Joins the tensor-parallel group as `rank` (every rank calls this with the same init_method)."""
    global _control_group
    timeout = _CONTROL_TIMEOUT if backend == "gloo" else timedelta(minutes=10)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timeout)
    _control_group = (dist.group.WORLD if backend == "gloo"
                      else dist.new_group(backend="gloo", timeout=_CONTROL_TIMEOUT))


def control_group() -> dist.ProcessGroup:
    if _control_group is None:
        raise RuntimeError("the distributed environment is not initialised")
    return _control_group


def destroy_distributed() -> None:
    """Leaves the groups, so that this process may join new ones. NCCL's orderly destroy can wait on
    the other ranks (here already gone or going), so NCCL groups are aborted instead."""
    global _control_group
    if dist.is_initialized():
        if dist.get_backend() == "nccl":
            dist.distributed_c10d._abort_process_group()
        else:
            dist.destroy_process_group()
    _control_group = None
