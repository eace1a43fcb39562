"""A one-shot all-reduce over peer GPU memory for the small tensors of decode steps (torch's symmetric
memory; vLLM's custom all-reduce idea), where NCCL's ring spends its time in latency.

Every rank of the group maps every other rank's copy of one buffer. The one kernel
(`symm_mem::one_shot_all_reduce_copy_out`) copies this rank's tensor into its buffer, meets the other
ranks at a barrier of signal flags, then sums all ranks' buffers, read over NVLink, into the tensor:
one launch and two barriers, where NCCL takes several steps. Every rank reads the others' whole
tensors, so it pays off below a size that shrinks as the group grows (_MAX_BYTES: 512 KiB for 4 ranks
and 256 KiB for more, where vLLM's custom all-reduce leaves its one-shot kernel; 1 MiB for 2, the top of
the sizes benchmarks/kernels/bench_all_reduce.py times); larger tensors, other dtypes than bf16 (the
kernel takes bf16 and fp32; the buffer is bf16, as models on GPUs are) and tensors the kernel cannot
take go to NCCL. The kernel is captured in CUDA graphs like any other. NVLink multicast (multimem) is
not used, so torch is told not to set it up (TORCH_SYMM_MEM_DISABLE_MULTICAST, unless already set).

The same memory serves a second kernel, kernels/all_reduce_rms_norm.py: the all-reduce of a row-parallel layer's
output fused with the residual add and RMSNorm after it (`add_rms_norm`), in a buffer and flags of its own.
WICK_FUSED_ALL_REDUCE_NORM=0 (on any rank) turns it off for every rank.

Set WICK_SYMM_ALL_REDUCE=0 to use NCCL for every size.
"""

from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

_MAX_BYTES = {2: 1 << 20, 4: 512 << 10}
_MAX_BYTES_MANY = 256 << 10  # 6 or 8 ranks
_ALIGN = 16  # the kernel's vector width; the buffer and the tensor must share it
_instance: SymmAllReduce | None = None


class SymmAllReduce:
    """The buffer of one group and the choice of the tensors it reduces."""

    def __init__(self, group: dist.ProcessGroup, device: torch.device, max_bytes: int, fuse_norm: bool) -> None:
        os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
        import torch.distributed._symmetric_memory as symm_mem

        from wick.kernels.all_reduce_rms_norm import FLAGS_PER_RANK, reset_flags

        self.group_name = group.group_name
        self.max_bytes = max_bytes
        self.buffer = symm_mem.empty(max_bytes // 2, dtype=torch.bfloat16, device=device)
        symm_mem.rendezvous(self.buffer, group)  # collective: maps every rank's buffer here
        self.rank = group.rank()
        self.norm_columns: int | None = None  # the rows' width of the first add_rms_norm, the only one it takes
        self.fuses_norm = fuse_norm
        if not fuse_norm:
            return
        self.norm_buffer = symm_mem.empty(max_bytes // 2, dtype=torch.bfloat16, device=device)
        self.norm_flags = symm_mem.empty(FLAGS_PER_RANK * group.size(), dtype=torch.int32, device=device)
        reset_flags(self.norm_flags)
        self.norm_buffer_ptrs, self.norm_flag_ptrs = (_peer_addresses(symm_mem.rendezvous(t, group), t, self.rank)
                                                       for t in (self.norm_buffer, self.norm_flags))
        torch.cuda.synchronize(device)  # the flags are set before any rank passes init_symm_all_reduce's agreement

    def can_reduce(self, x: torch.Tensor) -> bool:
        return (x.dtype == torch.bfloat16 and x.is_cuda and x.is_contiguous() and 0 < x.nbytes <= self.max_bytes
                and x.nbytes % _ALIGN == 0 and x.data_ptr() % _ALIGN == 0)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Sums `x` over the group, in place (`can_reduce(x)` must hold)."""
        staging = self.buffer[:x.numel()].view(x.shape)
        return torch.ops.symm_mem.one_shot_all_reduce_copy_out(staging, x, "sum", self.group_name, x)

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
                     ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(rms_norm(residual + x summed over the group) * weight, that residual, updated in place), as
        RMSNorm.forward(all-reduced x, residual) returns them, by one kernel; None where it cannot take these
        tensors: every rank must call it with tensors of the same shapes. Rows of one width only (the model's
        hidden size, set by the first call): a call's rows may overwrite the last call's only where they share
        it."""
        if not (self.fuses_norm and self.can_reduce(x) and x.dim() == 2 and residual.shape == x.shape
                and residual.dtype == x.dtype and residual.is_contiguous() and weight.dtype == x.dtype):
            return None
        if self.norm_columns is None:
            self.norm_columns = x.shape[1]
        if x.shape[1] != self.norm_columns:
            return None
        from wick.kernels.all_reduce_rms_norm import all_reduce_rms_norm

        out = all_reduce_rms_norm(x, residual, weight, eps, self.norm_buffer_ptrs, self.norm_flag_ptrs, self.rank)
        return out, residual


def _peer_addresses(handle: object, t: torch.Tensor, rank: int) -> torch.Tensor:
    """Every rank's address of symmetric tensor t (int64, on t's device): t lies at the same offset in every rank's
    allocation."""
    bases = handle.buffer_ptrs
    return torch.tensor([base + t.data_ptr() - bases[rank] for base in bases], dtype=torch.int64, device=t.device)


def init_symm_all_reduce(group: dist.ProcessGroup, control: dist.ProcessGroup, device: torch.device) -> None:
    """Sets up the one-shot all-reduce for `group` (an NCCL group; every rank calls this) or leaves NCCL for
    every size, with the reason in the log; the ranks agree over `control` so that all take the same path."""
    global _instance
    _instance = None
    world = group.size()
    max_bytes = _MAX_BYTES.get(world, _MAX_BYTES_MANY)
    reducer, reason = None, None
    fuse_norm = torch.tensor([int(os.environ.get("WICK_FUSED_ALL_REDUCE_NORM", "1") != "0")])
    dist.all_reduce(fuse_norm, op=dist.ReduceOp.MIN, group=control)  # every rank makes the norm's memory, or none
    if os.environ.get("WICK_SYMM_ALL_REDUCE", "1") == "0":
        reason = "WICK_SYMM_ALL_REDUCE=0"
    elif not hasattr(torch.ops.symm_mem, "one_shot_all_reduce_copy_out"):
        reason = f"torch {torch.__version__} has no symm_mem.one_shot_all_reduce_copy_out"
    else:
        try:
            reducer = SymmAllReduce(group, device, max_bytes, bool(fuse_norm.item()))
        except (RuntimeError, ImportError, AttributeError) as e:
            reason = f"symmetric memory is not available: {e}"
    agreed = torch.tensor([int(reducer is not None)])
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN, group=control)
    if agreed.item():
        _instance = reducer
        logger.info("one-shot all-reduce over symmetric memory for tensors up to %d KiB, NCCL above%s",
                    max_bytes >> 10, "; fused with the norm after it" if reducer.fuses_norm else "")
    elif reason == "WICK_SYMM_ALL_REDUCE=0":
        logger.info("all-reduce over NCCL at every size: %s", reason)
    else:
        logger.warning("all-reduce over NCCL at every size: %s", reason or "another rank has no symmetric memory")


def symm_all_reduce() -> SymmAllReduce | None:
    """The one-shot all-reduce of the tensor-parallel group, if this process has one."""
    return _instance
