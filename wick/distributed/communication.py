"""The collectives the layers and the sampler use over the tensor-parallel group (one process per rank)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from wick.distributed.symm_all_reduce import symm_all_reduce


def tp_world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def tp_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def tp_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """The sum of `x` over the ranks (in place): one-shot over peer memory when small, else NCCL or gloo."""
    if tp_world_size() > 1:
        one_shot = symm_all_reduce()
        if one_shot is not None and one_shot.can_reduce(x):
            return one_shot(x)
        dist.all_reduce(x)
    return x


class PartialSum:
    """A row-parallel layer's output before its all-reduce (this rank's addend), left for the norm that reads it,
    which may sum it in its own kernel (SymmAllReduce.add_rms_norm); `value()` all-reduces it."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x

    def add_rms_norm(self, residual: torch.Tensor, weight: torch.Tensor, eps: float
                     ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(rms_norm(the sum + residual) * weight, the sum + residual, in residual) by one kernel, or None where
        no kernel can take these tensors."""
        one_shot = symm_all_reduce()
        return None if one_shot is None else one_shot.add_rms_norm(self.x, residual, weight, eps)

    def value(self) -> torch.Tensor:
        return tp_all_reduce(self.x)


def tp_all_gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    size = tp_world_size()
    if size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=-1)


def tp_broadcast(x: torch.Tensor) -> torch.Tensor:
    """Every rank gets rank 0's `x` (in place)."""
    if tp_world_size() > 1:
        dist.broadcast(x, src=0)
    return x
