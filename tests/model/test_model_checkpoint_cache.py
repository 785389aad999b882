"""The int8 checkpoint cache: keyed by the GGUF's sha256, converted once when processes start together, and
never read half-written."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from salon.engine.model.checkpoint import checkpoint_path, ensure_checkpoint
from salon.engine.model.loader import open_model_file
from salon.engine.model.sources import resolve_source
from tests.model.gguf_files import write_llama_gguf

ROOT = Path(__file__).resolve().parents[2]

CONVERT = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from salon.engine.model.loader import open_model_file
    from salon.engine.model import checkpoint
    gguf, cache, go, crash = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4] == "crash"
    if crash:  # die half-way through writing the checkpoint, as a killed process would
        real = checkpoint.save_file
        def half_then_die(tensors, filename, metadata=None):
            real(tensors, filename, metadata=metadata)
            size = os.path.getsize(filename)
            with open(filename, "r+b") as f:
                f.truncate(size // 2)
            os._exit(3)
        checkpoint.save_file = half_then_die
    mf = open_model_file(gguf, cache)
    Path(f"{go}.ready.{os.getpid()}").touch()
    while not go.exists():
        time.sleep(0.005)
    path, converted = checkpoint.ensure_checkpoint(mf, cache, progress=False)
    print("CONVERTED" if converted else "FOUND", path)
""")


def start(gguf: Path, cache: Path, go: Path, mode: str = "normal") -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", CONVERT, str(gguf), str(cache), str(go), mode],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_ready(go: Path, n: int, procs) -> None:
    deadline = time.monotonic() + 120
    while len(list(go.parent.glob(go.name + ".ready.*"))) < n:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.02)


@pytest.fixture
def gguf_file(tmp_path) -> Path:
    path = tmp_path / "model.gguf"
    write_llama_gguf(path, num_layers=4, d_model=128, ffn=256, seed=3)
    return path


def test_two_processes_converting_at_once_convert_once(gguf_file, tmp_path):
    cache, go = tmp_path / "cache", tmp_path / "go"
    procs = [start(gguf_file, cache, go) for _ in range(2)]
    wait_ready(go, 2, procs)
    go.touch()
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    words = sorted(out.split()[0] for out, _ in outs)
    assert words == ["CONVERTED", "FOUND"], outs  # the second waited on the lock, then found the result
    paths = {out.split()[1] for out, _ in outs}
    assert paths == {str(checkpoint_path(resolve_source(str(gguf_file)).sha256, cache))}
    assert load_file(paths.pop())  # a whole, readable checkpoint


def test_a_conversion_that_dies_half_way_leaves_nothing_that_is_read(gguf_file, tmp_path):
    cache, go = tmp_path / "cache", tmp_path / "go"
    go.touch()
    crashed = start(gguf_file, cache, go, "crash")
    crashed.communicate(timeout=300)
    assert crashed.returncode == 3
    final = checkpoint_path(resolve_source(str(gguf_file)).sha256, cache)
    assert not final.exists()
    assert list(final.parent.glob(".*.tmp"))  # the half-written file is there, under its temporary name
    path, converted = ensure_checkpoint(open_model_file(str(gguf_file), cache), cache, progress=False)
    assert converted and path == final and load_file(str(path))  # the lock died with its holder


def test_the_cache_is_keyed_by_the_file_content(gguf_file, tmp_path):
    cache = tmp_path / "cache"
    path, converted = ensure_checkpoint(open_model_file(str(gguf_file), cache), cache, progress=False)
    assert converted
    copy = tmp_path / "renamed-copy.gguf"
    shutil.copyfile(gguf_file, copy)
    again, converted = ensure_checkpoint(open_model_file(str(copy), cache), cache, progress=False)
    assert (again, converted) == (path, False)
    other = tmp_path / "other.gguf"
    write_llama_gguf(other, num_layers=4, d_model=128, ffn=256, seed=4)
    third, converted = ensure_checkpoint(open_model_file(str(other), cache), cache, progress=False)
    assert converted and third != path
    a, b = load_file(str(path)), load_file(str(third))
    assert not torch.equal(a["layers.0.qkv.w_q"], b["layers.0.qkv.w_q"])
    assert os.path.basename(os.path.dirname(third)) == resolve_source(str(other)).sha256
