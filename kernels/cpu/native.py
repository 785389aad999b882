"""The C kernels of kernels/cpu/: compiled with the system C compiler on first use, loaded with ctypes.

Each source is compiled with -mavx2 (kernels that need AVX-512 enable it per function) into a library
named by the hash of its source, the headers beside it and the compiler flags, so a changed kernel is
rebuilt; it is renamed into place, so concurrent builders never load a half-written file. Without a C compiler, or on a CPU without
AVX2, `load` returns None and callers take their PyTorch path. `python -m kernels.cpu.native` builds
them all ahead of time (the Dockerfile does).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
import tempfile
import threading
from pathlib import Path

_CFLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC")
_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL | None] = {}
_typed: set[tuple[str, str]] = set()


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The flags of /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    return frozenset(next((ln for ln in text.splitlines() if ln.startswith("flags")), "").split()[2:])


def has_avx512() -> bool:
    return {"avx2", "avx512f", "avx512bw"} <= cpu_flags()


def cpu_isas() -> tuple[str, ...]:
    """The int8 GEMM kernels this CPU can run, best first: "vnni" (AVX-512 VNNI), "avx2"; () when neither."""
    if "avx2" not in cpu_flags():
        return ()
    return ("vnni", "avx2") if has_avx512() and "avx512_vnni" in cpu_flags() else ("avx2",)


def load(source: Path, signatures: dict[str, list], build_dir: Path | None = None) -> ctypes.CDLL | None:
    """The library built from `source`, its functions typed by `signatures` (name -> argtypes); None
    where it cannot be built or loaded here. Built once per source version, loaded once per process."""
    key = str(source)
    lib = _loaded.get(key, False)
    if lib is False:
        with _lock:
            if key not in _loaded:
                _loaded[key] = _build_and_open(source, build_dir)
            lib = _loaded[key]
    if lib is not None and not _typed.issuperset((key, name) for name in signatures):
        with _lock:
            try:
                for name, argtypes in signatures.items():
                    fn = getattr(lib, name)
                    fn.restype = None
                    fn.argtypes = argtypes
                    _typed.add((key, name))
            except AttributeError:
                return None
    return lib


def _build_and_open(source: Path, build_dir: Path | None) -> ctypes.CDLL | None:
    try:
        if "avx2" not in cpu_flags():
            raise OSError("no AVX2")
        text = source.read_text()
        headers = "".join(h.read_text() for h in sorted(source.parent.glob("*.h")))  # what it may #include
        digest = hashlib.sha256(" ".join(_CFLAGS).encode() + b"\n" + text.encode() + headers.encode()).hexdigest()[:16]
        out_dir = build_dir or Path(tempfile.gettempdir()) / "salon-kernels"
        out_dir.mkdir(parents=True, exist_ok=True)
        so_path = out_dir / f"{source.stem}_{digest}.so"
        if not so_path.exists():
            tmp = out_dir / f"{source.stem}_{digest}.{os.getpid()}.{threading.get_ident()}.so"
            subprocess.run(["cc", *_CFLAGS, "-I", str(source.parent), "-o", str(tmp), str(source), "-lm"], check=True,
                           capture_output=True, timeout=120)
            tmp.replace(so_path)
        return ctypes.CDLL(str(so_path))
    except (OSError, subprocess.SubprocessError):
        return None


def build_all() -> list[str]:
    """Builds every kernel of kernels/cpu/ (e.g. while building an image); the names of those that failed."""
    return [src.name for src in sorted(Path(__file__).parent.glob("*.c")) if load(src, {}) is None]


if __name__ == "__main__":
    failed = build_all()
    print("built every CPU kernel" if not failed else f"could not build: {', '.join(failed)}")
