"""Resident pages of memory-mapped weight files that were copied and are not read any more.

A weight repacked at load (the GGUF CPU kernels) still has its file's pages in the process's resident memory
until the kernel is told they are not needed: then a model would cost its file twice. Dropping them is safe
for a read-only file map: a later read faults them back in from the file (or the page cache). The repacking's
own temporaries, once freed, stay resident in the C heap until it is trimmed (trim_heap)."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import weakref

import numpy as np
import torch

_maps: list[weakref.ref[np.memmap]] = []


def register_file_map(array: np.memmap) -> None:
    """Lets release_file_pages drop pages of `array`, a read-only map of a whole file."""
    _maps[:] = [ref for ref in _maps if ref() is not None]
    _maps.append(weakref.ref(array))


def release_file_pages(tensor: torch.Tensor) -> None:
    """Drops the whole pages under `tensor` from resident memory if it is a contiguous view of a registered file
    map; does nothing otherwise."""
    if not tensor.is_contiguous() or tensor.device.type != "cpu":
        return
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    for ref in _maps:
        array = ref()
        if array is None or array.offset != 0 or not isinstance(array._mmap, mmap.mmap):
            continue
        base = array.ctypes.data
        if base <= start and end <= base + array.nbytes:
            first = -(-(start - base) // mmap.PAGESIZE) * mmap.PAGESIZE
            last = (end - base) // mmap.PAGESIZE * mmap.PAGESIZE
            if last > first:
                array._mmap.madvise(mmap.MADV_DONTNEED, first, last - first)
            return


def trim_heap() -> None:
    """Returns the C heap's free memory to the system where the C library is glibc (malloc_trim); repacking the
    Qwen2.5-Coder-0.5B Q4_K_M file's weights for the CPU kernels left about 80 MiB of freed temporaries resident."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        trim = None
    if trim is not None:
        trim(0)
