"""Host memory in transparent huge pages (Linux): one private anonymous mapping advised MADV_HUGEPAGE.

A decode step streams every weight once (about 300 MB for Gemma 3 270M in int8). In 4 KB pages that is some
75,000 TLB misses a step, each a page walk while the stream waits; in 2 MB pages it is about 150. Tensors from the
allocator sit in 4 KB anonymous pages wherever the kernel's transparent huge pages are "madvise" only, as they
commonly are. Private, because a shared anonymous mapping is shared memory, which has huge pages of its own
setting (usually off).

    huge_page_arena(nbytes) -> uint8[nbytes] starting on a huge-page boundary of such a mapping, or None where
                               the platform has no MADV_HUGEPAGE

The mapping lives as long as any view of the tensor (torch.frombuffer holds it); the kernel backs it with huge
pages as far as it can and with small pages elsewhere, so the values never depend on it.
"""

from __future__ import annotations

import ctypes
import mmap

import torch

HUGE_PAGE_BYTES = 2 << 20


def huge_page_arena(nbytes: int) -> torch.Tensor | None:
    """uint8[nbytes] (zeros) at a huge-page boundary of a fresh mapping advised MADV_HUGEPAGE, or None."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return None
    # one huge page more, so that the arena can start on a huge-page boundary
    size = -(-(max(nbytes, 1) + HUGE_PAGE_BYTES) // mmap.PAGESIZE) * mmap.PAGESIZE
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(mmap.MADV_HUGEPAGE)
    start = -ctypes.addressof(ctypes.c_char.from_buffer(region)) % HUGE_PAGE_BYTES
    return torch.frombuffer(region, dtype=torch.uint8)[start : start + nbytes]
