"""Programmatic dependent launch (Hopper and later). A kernel launched with it (`launch_pdl=True`) may start
while the kernel before it ends: it must wait (`gdc_wait`) before it reads or writes memory that kernel touches,
and may load what no kernel writes (weights) before that. A kernel that calls `gdc_launch_dependents` lets such a
successor launch at once instead of when it ends.

A kernel of a decode step takes part through one constexpr, PDL (set by pdl_options): it lets its successor launch
(the float and fp8 GEMVs at their start, the small kernels and the int8 GEMVs by `pdl_prologue`, GPTQ's after its
first loads of weights) and waits before it touches memory another kernel writes, in every program that touches any
(a program that ends having touched none may end without waiting, as a decode attention's split without keys does,
so long as one program of the launch waits). So a kernel that has waited may read what any kernel before it wrote:
the one before it has ended, and that one ended only after a wait of its own. A successor's programs launch once
every program of the kernel has started, so they take no SM from it; but they are placed on the SMs free at that
moment, so a kernel of one wave sized to the SMs (the int8 GEMVs) must not launch while a GEMV still runs: the
kernels that round x for one release it only after their wait (`before_int8_gemv`), when the GEMV before them has
ended, and `quantize_q8` launches without PDL.

Where a small kernel sits between two GEMVs, releasing the second at its start hides that launch, which pays where
GEMVs take a few microseconds, but lets the second GEMV's programs take SMs while the first one's last wave still
runs, which costs the larger models more (docs/benchmarks.md, sessions 22 and 23). So a model chooses, once, by its
hidden size and weights (set_release_early): PDL is 1 where small kernels release their successor at their start, 2
where they release it after their wait. The float and fp8 GEMVs release theirs at their start either way; the int8
GEMVs use `pdl_prologue`, whose order is always the early one in the models that run them."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

# gdc_wait, gdc_launch_dependents and the launch_pdl option came together (Triton 3.4).
TRITON_HAS_PDL = hasattr(tl.extra.cuda, "gdc_wait")
# Models whose hidden size is below this have small kernels release their successor at their start.
RELEASE_EARLY_BELOW_HIDDEN = 2048
_release_early = True


@functools.cache
def hopper_or_later(device: torch.device) -> bool:
    """An NVIDIA GPU of compute capability 9.0 or later (a ROCm build reports its GPUs as CUDA ones too)."""
    return torch.version.hip is None and torch.cuda.get_device_capability(device) >= (9, 0)


def uses_pdl(t: torch.Tensor) -> bool:
    """Whether kernels on t's device take part in programmatic dependent launch."""
    return TRITON_HAS_PDL and t.is_cuda and hopper_or_later(t.device)


def set_release_early(hidden_size: int, int8_activations: bool) -> None:
    """Chooses, for the model of this process, where small kernels release their successor (the module's docstring):
    at their start below RELEASE_EARLY_BELOW_HIDDEN, and where the GEMVs take int8 activations (whose quantize
    kernel launches without PDL: there the late release measured 1% slower), else after their wait."""
    global _release_early
    _release_early = hidden_size < RELEASE_EARLY_BELOW_HIDDEN or int8_activations


def pdl_options(t: torch.Tensor, before_int8_gemv: bool = False) -> dict[str, int | bool]:
    """Launch options of a kernel with a PDL constexpr that waits before it touches its predecessor's memory: PDL (0
    off, 1 releasing early, 2 late, and late always where `before_int8_gemv`: a kernel whose successor is an int8
    GEMV), and launch_pdl only where it is on (a Triton without PDL rejects the option even when false)."""
    if not uses_pdl(t):
        return {"PDL": 0}
    return {"PDL": 1 if _release_early and not before_int8_gemv else 2, "launch_pdl": True}


@triton.jit
def pdl_prologue(PDL: tl.constexpr):
    """Where PDL is 1: lets the kernel's successor launch, then waits for the kernel before it; where 2, the other
    way round; where 0 (PDL off), nothing."""
    tl.static_assert(PDL >= 0 and PDL <= 2, "PDL is 0, 1 or 2")
    if PDL == 1:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    elif PDL == 2:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
