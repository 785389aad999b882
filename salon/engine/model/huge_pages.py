"""A checkpoint's tensors in transparent huge pages (Linux, CPU).

A decode step streams every weight once (about 300 MB for Gemma 3 270M in int8). In 4 KB pages that is some
75,000 TLB misses a step, each a page walk while the stream waits. In 2 MB pages it is about 150. A checkpoint
read from disk sits in the file's pages, and tensors from the allocator sit in 4 KB anonymous pages wherever
the kernel's transparent huge pages are "madvise" only, as they commonly are.

    in_huge_pages(tensors) -> the same tensors (names, dtypes, shapes, values), copied into one anonymous
                              mapping advised MADV_HUGEPAGE, each at a 64-byte aligned offset

Huge pages pay where a step is bound by reading the weights (decode at a few rows: a step's weight stream makes
about 150 page walks instead of about 75,000), not where it is bound by the products (8 rows and up on AVX2).
Measured by `python -m bench.gemv --quick` against anonymous 4 KB pages; `python -m bench.model` reports the
engine's batch-1 decode against the file's pages (huge_pages_decode_b1_speedup_x).

Where the platform has no MADV_HUGEPAGE, or the tensors are not on the CPU, they are returned unchanged. The
mapping lives as long as any tensor of it (each holds it through torch.frombuffer); the kernel backs it with
huge pages as far as it can and with small pages elsewhere, so the values never depend on it.
"""

from __future__ import annotations

import torch

from salon.kernels.cpu.huge_pages import HUGE_PAGE_BYTES, huge_page_arena

__all__ = ["ALIGN_BYTES", "HUGE_PAGE_BYTES", "in_huge_pages"]
ALIGN_BYTES = 64


def _aligned(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def in_huge_pages(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`tensors` copied into one mapping advised MADV_HUGEPAGE (see the module docstring), or unchanged."""
    if not tensors or any(t.device.type != "cpu" for t in tensors.values()):
        return tensors
    offsets: dict[str, int] = {}
    total = 0
    for name, t in tensors.items():
        offsets[name] = total
        total += _aligned(max(t.numel() * t.element_size(), 1), ALIGN_BYTES)
    arena = huge_page_arena(total)
    if arena is None:
        return tensors
    out = {}
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        copy = arena[offsets[name] : offsets[name] + nbytes].view(t.dtype).view(t.shape)
        copy.copy_(t)
        out[name] = copy
    return out
