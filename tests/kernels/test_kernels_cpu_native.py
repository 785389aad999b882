"""kernels/cpu/native.py: every C kernel builds here, and a library loaded before its signatures were given
gets them when they are."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernels.cpu import native

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64" or shutil.which("cc") is None
                                or "avx2" not in native.cpu_flags(), reason="needs x86-64 with AVX2 and cc")


def test_every_kernel_builds():
    assert native.build_all() == []


def test_signatures_given_after_a_plain_load_are_applied():
    source = Path(native.__file__).with_name("quantize.c")
    code = (
        "import ctypes; from pathlib import Path; from kernels.cpu import native\n"
        f"src = Path({str(source)!r})\n"
        "assert native.load(src, {}) is not None\n"
        "lib = native.load(src, {'quantize_rows': [ctypes.c_void_p] * 2})\n"
        "assert lib.quantize_rows.argtypes == [ctypes.c_void_p] * 2\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(native.__file__).parents[2])


def test_prebuild_command():
    out = subprocess.run([sys.executable, "-m", "kernels.cpu.native"], capture_output=True, text=True, check=True,
                         cwd=Path(native.__file__).parents[2])
    assert out.stdout.strip() == "built every CPU kernel"
