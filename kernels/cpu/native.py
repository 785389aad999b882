"""The C kernels of kernels/cpu/: compiled with the system C compiler on first use, loaded with ctypes.

Each source is compiled with -mavx2 (kernels that need AVX-512 enable it per function) into a library
named by the hash of its source, so a changed kernel is rebuilt and concurrent builders never load a
half-written file. (The name also hashes the compiler flags.) Without a C compiler, or on a CPU without AVX2, `load` returns None and callers take
their PyTorch path.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import subprocess
import tempfile
import threading
from pathlib import Path

_CFLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC")
_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL | None] = {}


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
    with _lock:
        if key in _loaded:
            return _loaded[key]
        lib = None
        try:
            if "avx2" not in cpu_flags():
                raise OSError("no AVX2")
            text = source.read_text()
            digest = hashlib.sha256((" ".join(_CFLAGS) + "\n" + text).encode()).hexdigest()[:16]
            out_dir = build_dir or Path(tempfile.gettempdir()) / "salon-kernels"
            out_dir.mkdir(parents=True, exist_ok=True)
            so_path = out_dir / f"{source.stem}_{digest}.so"
            if not so_path.exists():
                src = out_dir / f"{source.stem}_{digest}.c"
                src.write_text(text)
                tmp = out_dir / f"{source.stem}_{digest}.{threading.get_ident()}.so"
                subprocess.run(["cc", *_CFLAGS, "-o", str(tmp), str(src), "-lm"], check=True, capture_output=True,
                               timeout=120)
                tmp.replace(so_path)
            lib = ctypes.CDLL(str(so_path))
            for name, argtypes in signatures.items():
                fn = getattr(lib, name)
                fn.restype = None
                fn.argtypes = argtypes
        except (OSError, subprocess.SubprocessError, AttributeError):
            lib = None
        _loaded[key] = lib
        return lib
