"""The loader's huge pages (salon/engine/model/huge_pages.py): in_huge_pages gives back every tensor with
its name, dtype, shape and bits, in one private anonymous mapping the kernel counts as huge-page eligible
(`THPeligible: 1` in /proc/self/smaps: madvised, and not shared memory), 64-byte aligned, the first tensor on
a huge-page boundary; the serving model's weights are placed there by load(), and huge_pages=False leaves them
out. Seeded random tensors of every dtype a checkpoint holds, odd sizes, and more than two huge pages in all
(a mapping too small to hold one whole aligned huge page is never eligible)."""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest
import torch

from salon.engine.model import load_model
from salon.engine.model.huge_pages import ALIGN_BYTES, HUGE_PAGE_BYTES, in_huge_pages

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
needs_thp = pytest.mark.skipif(
    not hasattr(mmap, "MADV_HUGEPAGE")
    or not THP.exists()
    or "[never]" in THP.read_text()
    or not Path("/proc/self/smaps").exists(),
    reason="needs Linux with transparent huge pages not off",
)


def _mapping_of(address: int) -> dict[str, str]:
    """The /proc/self/smaps fields of the mapping holding `address`."""
    fields: dict[str, str] = {}
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
            continue
        if inside and ":" in head:
            fields[head.rstrip(":")] = line.split(":", 1)[1].strip()
    return fields


def _tensors(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "a.w_q": torch.randint(-128, 128, (7001, 640), dtype=torch.int8, generator=g),  # 4.5 MB: whole huge pages
        "a.w_scale": torch.randn(7001, 20, generator=g),
        "norm": torch.randn(7, generator=g),
        "b.w_q": torch.randint(-128, 128, (3, 5), dtype=torch.int8, generator=g),
        "half": torch.randn(9, 3, generator=g).to(torch.bfloat16),
        "ids": torch.randint(0, 1 << 40, (13,), dtype=torch.int64, generator=g),
        "empty": torch.zeros(0, 4),
        "strided": torch.randn(6, 8, generator=g)[:, ::2],
    }


@needs_thp
@pytest.mark.parametrize("seed", [0, 1])
def test_every_tensor_comes_back_equal_in_one_huge_page_mapping(seed):
    src = _tensors(seed)
    out = in_huge_pages(src)
    assert list(out) == list(src)
    for name, t in src.items():
        got = out[name]
        assert got.dtype == t.dtype and got.shape == t.shape and got.is_contiguous(), name
        assert torch.equal(got, t), name
        if t.numel():
            assert got.data_ptr() % ALIGN_BYTES == 0, name
            assert got.data_ptr() != t.data_ptr(), name
    first = out["a.w_q"].data_ptr()
    assert first % HUGE_PAGE_BYTES == 0
    mapping = _mapping_of(first)
    assert mapping.get("THPeligible") == "1", mapping
    assert _mapping_of(out["strided"].data_ptr()) == _mapping_of(first)  # one mapping for all


@needs_thp
def test_the_copies_do_not_share_memory_with_each_other():
    out = in_huge_pages(_tensors(2))
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in out.values() if t.numel())
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end <= start


def test_nothing_to_place_is_returned_as_is():
    assert in_huge_pages({}) == {}


@needs_thp
def test_the_served_models_weights_are_in_huge_pages_and_the_baseline_is_not():
    """The output projection (the tied embedding table: 168 MB, half of what a decode step reads)."""
    model, _ = load_model("gemma-3-270m", "int8", progress=False)
    plain, _ = load_model("gemma-3-270m", "int8", progress=False, huge_pages=False)
    assert _mapping_of(model.lm_head.w_q.data_ptr()).get("THPeligible") == "1"
    assert _mapping_of(model.lm_head.w_scale.data_ptr()).get("THPeligible") == "1"
    assert _mapping_of(plain.lm_head.w_q.data_ptr()).get("THPeligible") != "1"
    assert torch.equal(model.lm_head.w_q, plain.lm_head.w_q)
