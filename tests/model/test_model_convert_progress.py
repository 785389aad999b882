"""A conversion prints its progress: a line per 10% of its tensor work, calibration, and the end."""

from __future__ import annotations

import re

from salon.engine.model.checkpoint import ensure_checkpoint
from salon.engine.model.loader import open_model_file
from tests.model.gguf_files import write_llama_gguf


def test_conversion_prints_a_line_per_tenth_of_its_tensors(tmp_path, capsys):
    path = tmp_path / "tiny-llama.gguf"
    write_llama_gguf(path, num_layers=4)
    mf = open_model_file(str(path))
    _, converted = ensure_checkpoint(mf, tmp_path / "cache")
    assert converted
    lines = capsys.readouterr().out.splitlines()
    prefix = "convert tiny-llama to int8: "
    assert lines and all(line.startswith(prefix) for line in lines), lines
    body = [line.removeprefix(prefix) for line in lines]
    assert re.fullmatch(r"done in \d+ s", body[-1]), body
    calibrating = [i for i, b in enumerate(body) if b.endswith("(calibrating)")]
    assert len(calibrating) == 1, body
    # 4 layers x 9 tensors + 3 others = 39, each read once and quantized once (78 units). Reading passes 10% to
    # 50%; quantizing: the 3 others (42 units, 53%), then a layer each: 65%, 76%, 88% and the end (no line).
    steps = [re.fullmatch(r"(\d+)% of tensors \((reading the GGUF|quantizing)\)", b) for b in body]
    percents = [int(m.group(1)) for m in steps if m]
    assert percents == [10, 20, 30, 40, 50, 60, 70, 80], body
    assert body[calibrating[0] - 1] == "50% of tensors (reading the GGUF)"
    assert body[calibrating[0] + 1] == "60% of tensors (quantizing)"
    # Nothing again once converted.
    _, again = ensure_checkpoint(mf, tmp_path / "cache")
    assert not again and capsys.readouterr().out == ""
