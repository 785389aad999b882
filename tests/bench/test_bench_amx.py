"""bench/amx.py: each figure is AMX against VNNI in alternated rounds, a ratio per round with both medians; with AMX
off (or absent) the bench measures nothing and says so."""

import json

import pytest

from bench import amx as bench_amx
from salon.kernels.cpu.w8a8_grouped import amx_min_rows, use_amx


def test_without_amx_nothing_is_measured(monkeypatch, capsys):
    monkeypatch.setattr(bench_amx, "use_amx", lambda on=None: False)
    bench_amx.main(["--quick"])
    out = capsys.readouterr().out
    result = json.loads(out.split("RESULT ", 1)[1])
    assert result == {"amx": False, "threads": 2, "rounds": 3, "peer": None}
    assert "nothing measured" in out


def test_the_gemm_section_alternates_and_restores_the_switches(capsys):
    if not use_amx(True):
        pytest.skip("needs AMX (AMX-INT8 and a kernel that grants the tile state)")
    result: dict = {}
    bench_amx.gemm_section(result, 2, rows=(8, 16))
    for m in (8, 16):
        ratio = result[f"gemm_resident_m{m}_amx_over_vnni_x"]
        assert ratio["rounds"] == 2 and ratio["min"] <= ratio["median"] <= ratio["max"]
        assert ratio["amx_median"] > 0 and ratio["vnni_median"] > 0
    assert use_amx() and amx_min_rows() == 63
    assert "AMX over VNNI" in capsys.readouterr().out
