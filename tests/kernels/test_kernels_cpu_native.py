"""salon/kernels/cpu/native.py: every C kernel builds here, and a library loaded before its signatures were given
gets them when they are."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from salon.kernels.cpu import native

pytestmark = pytest.mark.skipif(
    platform.machine() != "x86_64" or shutil.which("cc") is None or "avx2" not in native.cpu_flags(),
    reason="needs x86-64 with AVX2 and cc",
)


def test_every_kernel_builds_and_loads():
    assert native.build_all() == []
    for source in Path(native.__file__).parent.glob("*.c"):
        assert native.load(source, {}) is not None, source.name


def test_signatures_given_after_a_plain_load_are_applied():
    source = Path(native.__file__).with_name("quantize.c")
    code = (
        "import ctypes; from pathlib import Path; from salon.kernels.cpu import native\n"
        f"src = Path({str(source)!r})\n"
        "assert native.load(src, {}) is not None\n"
        "lib = native.load(src, {'quantize_rows_avx2': [ctypes.c_void_p] * 2})\n"
        "assert lib.quantize_rows_avx2.argtypes == [ctypes.c_void_p] * 2\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(native.__file__).parents[3])


def test_prebuild_command_fills_an_empty_cache(tmp_path):
    """`python -m salon.kernels.cpu.native` (scripts/setup.sh's step) builds every kernel into the cache, so that
    a load after it compiles nothing: each library is there, and loading it leaves it as it was."""
    cache = tmp_path / "kernels"
    env = {**os.environ, "SALON_KERNEL_CACHE_DIR": str(cache)}
    out = subprocess.run(
        [sys.executable, "-m", "salon.kernels.cpu.native"],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(native.__file__).parents[3],
        env=env,
    )
    assert out.stdout.strip() == "built every CPU kernel"
    sources = sorted(Path(native.__file__).parent.glob("*.c"))
    built = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    assert sorted(built) == sorted(native.library_name(src) for src in sources)
    code = (
        "from pathlib import Path; from salon.kernels.cpu import native\n"
        "assert all(native.load(src, {}) for src in Path(native.__file__).parent.glob('*.c'))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(native.__file__).parents[3], env=env)
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == built


# ---- only private builds are loaded ---------------------------------------------------------------

_PLANT = """#include <stdio.h>
__attribute__((constructor)) static void planted(void) { FILE *f = fopen("%s", "w"); if (f) fclose(f); }
void quantize_rows_avx2(void) {}
"""


def _plant(tmp_path: Path, directory: Path, mode: int = 0o644) -> Path:
    """A library at the name the quantize kernel would load, that leaves a marker file when loaded."""
    marker = tmp_path / "planted-code-ran"
    src = tmp_path / "plant.c"
    src.write_text(_PLANT % marker)
    target = directory / native.library_name(Path(native.__file__).with_name("quantize.c"))
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(target), str(src)], check=True)
    target.chmod(mode)
    return marker


def _load_quantize(cache_dir: Path) -> subprocess.CompletedProcess:
    """native.load of the quantize kernel in a fresh process whose kernel cache is `cache_dir`."""
    code = (
        "import sys, warnings; from pathlib import Path; from salon.kernels.cpu import native\n"
        "warnings.simplefilter('always')\n"
        "lib = native.load(Path(native.__file__).with_name('quantize.c'), {})\n"
        "print('LOADED' if lib is not None else 'REFUSED')\n"
    )
    import os

    env = {**os.environ, "SALON_KERNEL_CACHE_DIR": str(cache_dir)}
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=Path(native.__file__).parents[3],
    )


def test_a_library_planted_in_a_world_writable_directory_is_not_loaded(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    marker = _plant(tmp_path, shared)
    result = _load_quantize(shared)
    assert "REFUSED" in result.stdout, result
    assert "writable by group or others" in result.stderr and "mode 0777" in result.stderr
    assert not marker.exists(), "the planted library ran"


def test_a_library_another_user_could_write_is_rebuilt_not_loaded(tmp_path):
    import os

    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    for mode in (0o666, 0o664):
        marker = _plant(tmp_path, private, mode)
        result = _load_quantize(private)
        assert "LOADED" in result.stdout and "rebuilding" in result.stderr, result
        assert not marker.exists(), "the planted library ran"
        rebuilt = private / native.library_name(Path(native.__file__).with_name("quantize.c"))
        assert rebuilt.stat().st_mode & 0o022 == 0
    if os.getuid() == 0:  # owned by someone else
        marker = _plant(tmp_path, private)
        os.chown(private / native.library_name(Path(native.__file__).with_name("quantize.c")), 4242, -1)
        result = _load_quantize(private)
        assert "LOADED" in result.stdout and "owned by uid 4242" in result.stderr, result
        assert not marker.exists()


def test_the_cache_is_created_private_and_a_loose_parent_is_refused(tmp_path):
    fresh = tmp_path / "cache" / "kernels"
    result = _load_quantize(fresh)
    assert "LOADED" in result.stdout, result
    assert fresh.stat().st_mode & 0o777 == 0o700
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)  # writable by anyone, no sticky bit: another user could swap the directory below
    (loose / "kernels").mkdir(mode=0o700)
    result = _load_quantize(loose / "kernels")
    assert "REFUSED" in result.stdout and "can be changed by other users" in result.stderr, result


def test_each_library_of_a_process_is_its_own():
    """Libraries are loaded through /proc/self/fd/N: one loaded after another must not be taken for it."""
    code = (
        "from pathlib import Path; from salon.kernels.cpu import native\n"
        "d = Path(native.__file__).parent\n"
        "first = native.load(d / 'w8a8_acc.c', {})\n"
        "second = native.load(d / 'quantize.c', {})\n"
        "assert first is not None and second is not None\n"
        "assert first._handle != second._handle, 'the second library is the first one'\n"
        "assert hasattr(second, 'quantize_rows_avx2') and not hasattr(first, 'quantize_rows_avx2')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(native.__file__).parents[3])
