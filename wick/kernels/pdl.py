"""Programmatic dependent launch (Hopper and later). A kernel launched with it (`launch_pdl=True`) may start
while the kernel before it ends: it must wait (`gdc_wait`) before it reads or writes memory that kernel touches,
and may load what no kernel writes (weights) before that. A kernel that calls `gdc_launch_dependents` lets such a
successor launch at once instead of when it ends.

A kernel of a decode step takes part through one constexpr, PDL (set by pdl_options): it lets its successor launch
(most at their start, `pdl_prologue`) and waits before it touches memory another kernel writes, in every program,
before it ends. So a kernel that has waited may read what any kernel before it wrote: the one before it has ended,
and that one ended only after its own wait. A successor's programs launch once every program of the kernel has
started, so they take no SM from it; but they are placed on the SMs free at that moment, so a kernel of one wave
sized to the SMs (the int8 GEMVs) must not launch early (int8_activations.quantize_q8)."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

# gdc_wait, gdc_launch_dependents and the launch_pdl option came together (Triton 3.4).
TRITON_HAS_PDL = hasattr(tl.extra.cuda, "gdc_wait")


@functools.cache
def _hopper(device: torch.device) -> bool:
    """An NVIDIA GPU of compute capability 9.0 or later (a ROCm build reports its GPUs as CUDA ones too)."""
    return torch.version.hip is None and torch.cuda.get_device_capability(device) >= (9, 0)


def uses_pdl(t: torch.Tensor) -> bool:
    """Whether kernels on t's device take part in programmatic dependent launch."""
    return TRITON_HAS_PDL and t.is_cuda and _hopper(t.device)


def pdl_options(t: torch.Tensor) -> dict[str, bool]:
    """Launch options of a kernel with a PDL constexpr that waits before it touches its predecessor's memory: PDL,
    and launch_pdl only where it is on (a Triton without PDL rejects the option even when false)."""
    return {"PDL": True, "launch_pdl": True} if uses_pdl(t) else {"PDL": False}


@triton.jit
def pdl_prologue(PDL: tl.constexpr):
    """Where PDL: lets the kernel's successor launch, then waits for the kernel before it."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
