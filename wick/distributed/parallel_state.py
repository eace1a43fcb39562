"""The process groups of one engine: every rank of the tensor-parallel group (NCCL on GPUs, gloo on
CPUs), a gloo group beside it for control (start-up agreements and the step channel's set-up), and,
when the ranks span several nodes, a gloo group of rank 0 and the other nodes' ranks, over which
their steps travel (rank 0's own node gets them through shared memory: executor/step_channel.py)."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from wick.distributed.symm_all_reduce import init_symm_all_reduce

# A worker waits in the control group for the next step for as long as the server stays idle.
_CONTROL_TIMEOUT = timedelta(days=365)
_control_group: dist.ProcessGroup | None = None
_remote_group: dist.ProcessGroup | None = None


def init_distributed(rank: int, world_size: int, ranks_per_node: int, init_method: str,
                     device: torch.device) -> None:
    """Joins the tensor-parallel group as `rank` (every rank calls this with the same init_method); the
    ranks of node k are k * ranks_per_node onwards."""
    global _control_group, _remote_group
    if dist.is_initialized():
        raise ValueError("this process already runs a tensor-parallel engine on GPUs; start another process")
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = _CONTROL_TIMEOUT if backend == "gloo" else timedelta(minutes=10)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timeout)
    _control_group = (dist.group.WORLD if backend == "gloo"
                      else dist.new_group(backend="gloo", timeout=_CONTROL_TIMEOUT))
    if world_size > ranks_per_node:  # every rank creates every group, members or not
        _remote_group = dist.new_group([0, *range(ranks_per_node, world_size)], backend="gloo",
                                       timeout=_CONTROL_TIMEOUT)
    if backend == "nccl" and world_size == ranks_per_node:  # peer memory needs every GPU on one machine
        init_symm_all_reduce(dist.group.WORLD, _control_group, device)


def control_group() -> dist.ProcessGroup:
    if _control_group is None:
        raise RuntimeError("the distributed environment is not initialised")
    return _control_group


def remote_group() -> dist.ProcessGroup | None:
    """Rank 0 and the ranks of the other nodes; None on one node."""
    return _remote_group


def destroy_distributed() -> None:
    """Leaves gloo groups, so that this process may join new ones. NCCL groups stay until the process
    exits: their destroy and abort both wait on the other ranks (measured on two H200s), which have
    gone or are going, so a process runs one tensor-parallel engine on GPUs."""
    global _control_group, _remote_group
    if dist.is_initialized() and dist.get_backend() == "gloo":
        dist.destroy_process_group()
        _control_group = _remote_group = None
