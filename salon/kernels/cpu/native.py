"""The C kernels of salon/kernels/cpu/: compiled with the system C compiler on first use, loaded with ctypes.

Each source is compiled with -mavx2 -mfma (kernels that need AVX-512 enable it per function) into a library
named by the hash of its source, the headers beside it and the compiler flags, so a changed kernel is
rebuilt; it is renamed into place, so concurrent builders never load a half-written file. Without a C compiler, or on a
CPU without
AVX2, `load` returns None and callers take their PyTorch path. `python -m salon.kernels.cpu.native` builds
them all ahead of time (the Dockerfile does).

Libraries run inside the engine, so they are built and loaded only from a private place: the
directory is SALON_KERNEL_CACHE_DIR, else $XDG_CACHE_HOME/salon/kernels, else ~/.cache/salon/kernels,
created 0700. Before anything is loaded, the directory, each directory above it and the library
itself must be owned by this user (or root) and not writable by group or others (a world-writable
ancestor is allowed only with the sticky bit, as /tmp has). A library that fails the check is
removed and rebuilt; a directory that fails it is refused (a warning says why, and the kernels take
their PyTorch paths). The library is opened once, checked on that descriptor and loaded through it,
so it cannot be swapped between the check and the load; the descriptor stays open, one per library.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import stat
import subprocess
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

_CFLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC")
_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL | None] = {}
_typed: set[tuple[str, str]] = set()
# source -> (the signatures it was last typed with, the library): load's per-call path, for callers that pass
# the same signatures object each time (held here, so `is` cannot match a new object at a reused address)
_ready: dict[str, tuple[object, ctypes.CDLL]] = {}


# SALON_CPU_ISA=avx2 makes this process (and every process it starts) run as on a CPU without AVX-512: the AVX-512
# flags are masked, so every kernel family picks its AVX2 build and the CPU's int8 Linears take the AVX2 recipe
# (how the AVX2 paths are tested on an AVX-512 machine). Unset or "native": the CPU's own flags. Read once, here.
CPU_ISA_ENV = "SALON_CPU_ISA"
CPU_ISA_CHOICES = ("native", "avx2")
_cpu_isa = os.environ.get(CPU_ISA_ENV) or "native"
if _cpu_isa not in CPU_ISA_CHOICES:
    raise ValueError(f"{CPU_ISA_ENV}: must be one of {', '.join(CPU_ISA_CHOICES)}, got {_cpu_isa!r}")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The flags of /proc/cpuinfo (empty where there is none), less the AVX-512 ones under SALON_CPU_ISA=avx2."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    flags = frozenset(next((ln for ln in text.splitlines() if ln.startswith("flags")), "").split()[2:])
    return frozenset(f for f in flags if not f.startswith("avx512")) if _cpu_isa == "avx2" else flags


@functools.cache
def has_avx512() -> bool:
    return {"avx2", "avx512f", "avx512bw"} <= cpu_flags()


@functools.cache
def simd_isas() -> tuple[str, ...]:
    """The builds of the SIMD kernels (paged attention, quantize, sample) this CPU can run, best first:
    "avx512" (AVX-512 F and BW), "avx2" (AVX2 and FMA); () when neither (callers take the PyTorch paths)."""
    if not {"avx2", "fma"} <= cpu_flags():
        return ()
    return ("avx512", "avx2") if has_avx512() else ("avx2",)


def simd_isa(isa: str | None = None) -> str | None:
    """The build a SIMD kernel runs: `isa` where this CPU runs it (tests name one), by default the best this
    CPU runs; None where that build cannot run here (callers take their PyTorch paths)."""
    isas = simd_isas()
    chosen = isa or next(iter(isas), None)
    return chosen if chosen in isas else None


@functools.cache
def cpu_isas() -> tuple[str, ...]:
    """The int8 GEMM kernels this CPU can run, best first: "vnni" (AVX-512 VNNI), "avx2"; () when neither."""
    if "avx2" not in cpu_flags():
        return ()
    return ("vnni", "avx2") if has_avx512() and "avx512_vnni" in cpu_flags() else ("avx2",)


class UnsafeBuildPath(OSError):
    """A build directory or library that another user could have written; the message says why."""


def cache_dir() -> Path:
    """Where this user's kernels are built (see the module docstring)."""
    configured = os.environ.get("SALON_KERNEL_CACHE_DIR")
    if configured:
        return Path(configured)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "salon" / "kernels"


def _trusted_owner(st: os.stat_result) -> bool:
    return st.st_uid in (os.getuid(), 0)


def _check_private_dir(path: Path) -> None:
    """UnsafeBuildPath unless `path` and every directory above it are safe to load code from."""
    st = os.stat(path, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeBuildPath(f"kernel cache {path} is not a directory")
    if not _trusted_owner(st) or st.st_mode & 0o022:
        raise UnsafeBuildPath(
            f"kernel cache {path} is owned by uid {st.st_uid} with mode "
            f"{stat.S_IMODE(st.st_mode):04o}: it must be this user's and not writable by group or others"
        )
    for parent in Path(os.path.realpath(path)).parents:
        pst = os.stat(parent)
        sticky = pst.st_mode & stat.S_ISVTX
        if not _trusted_owner(pst) or (pst.st_mode & 0o022 and not sticky):
            raise UnsafeBuildPath(
                f"kernel cache {path}: {parent} above it can be changed by other users "
                f"(uid {pst.st_uid}, mode {stat.S_IMODE(pst.st_mode):04o})"
            )


def private_build_dir(path: Path | None = None) -> Path:
    """The kernel cache, created 0700 if missing and checked; UnsafeBuildPath if it cannot be trusted."""
    path = path or cache_dir()
    if not path.exists():
        path.mkdir(parents=True, mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)
    _check_private_dir(path)
    return path


def _open_trusted_library(so_path: Path) -> int | None:
    """A descriptor of the library if it is safe to load; None if missing; UnsafeBuildPath otherwise."""
    try:
        fd = os.open(so_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UnsafeBuildPath(f"{so_path}: cannot be opened safely ({exc.strerror})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or not _trusted_owner(st) or st.st_mode & 0o022:
        os.close(fd)
        raise UnsafeBuildPath(f"{so_path}: owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):04o}")
    return fd


def _dlopen(fd: int, so_path: Path) -> ctypes.CDLL:
    """Load the library behind an open descriptor (the checked file, whatever the path names now).

    The descriptor stays open while the process runs: the dynamic loader knows a library by the name it
    was opened under, and a second library opened under a reused /proc/self/fd/N would be taken for the
    first one (dlopen would hand back the first library's handle)."""
    proc_path = f"/proc/self/fd/{fd}"
    try:
        return ctypes.CDLL(proc_path if os.path.exists(proc_path) else str(so_path))
    except OSError:
        os.close(fd)
        raise


def load(
    source: Path, signatures: dict[str, list | tuple[list, object]], build_dir: Path | None = None
) -> ctypes.CDLL | None:
    """The library built from `source`, its functions typed by `signatures` (name -> argtypes, returning
    nothing, or name -> (argtypes, restype)); None where it cannot be built or loaded here. Built once per
    source version, loaded once per process."""
    key = str(source)
    ready = _ready.get(key)
    if ready is not None and ready[0] is signatures:
        return ready[1]
    lib = _loaded.get(key, False)
    if lib is False:
        with _lock:
            if key not in _loaded:
                _loaded[key] = _build_and_open(source, build_dir)
            lib = _loaded[key]
    if lib is not None and not _typed.issuperset((key, name) for name in signatures):
        with _lock:
            try:
                for name, signature in signatures.items():
                    argtypes, restype = signature if isinstance(signature, tuple) else (signature, None)
                    fn = getattr(lib, name)
                    fn.restype = restype
                    fn.argtypes = argtypes
                    _typed.add((key, name))
            except AttributeError:
                return None
    if lib is not None:
        _ready[key] = (signatures, lib)
    return lib


def loaded_libraries() -> list[ctypes.CDLL]:
    """The libraries this process has loaded so far."""
    with _lock:
        return [lib for lib in _loaded.values() if lib is not None]


_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def _included_sources(source: Path, seen: set[Path] | None = None) -> list[Path]:
    """The files `source` includes by #include "name" (beside it), and theirs, each once, in first-seen order."""
    seen = set() if seen is None else seen
    found = []
    for name in _INCLUDE.findall(source.read_text()):
        path = source.parent / name
        if path not in seen and path.is_file():
            seen.add(path)
            found += [path, *_included_sources(path, seen)]
    return found


def library_name(source: Path) -> str:
    """The file name of `source`'s library: its stem and the hash of everything that decides its bytes (the
    source, every header beside it, and the files it includes, e.g. a fused kernel's parts, or a kernel and its
    headers from another folder)."""
    text = source.read_text()
    headers = "".join(h.read_text() for h in sorted(source.parent.glob("*.h")))  # what it may #include
    parts = "".join(p.read_text() for p in _included_sources(source) if p.suffix != ".h" or p.parent != source.parent)
    digest = hashlib.sha256(
        " ".join(_CFLAGS).encode() + b"\n" + text.encode() + headers.encode() + parts.encode()
    ).hexdigest()[:16]
    return f"{source.stem}_{digest}.so"


def _built(source: Path, build_dir: Path | None) -> tuple[Path, int]:
    """`source`'s library in the private build directory, compiled unless a trusted one is there: its path and an
    open descriptor of the checked file. Raises OSError or a subprocess error where it cannot be built,
    UnsafeBuildPath where the directory is not private."""
    if "avx2" not in cpu_flags():
        raise OSError("no AVX2")
    out_dir = private_build_dir(build_dir)
    so_path = out_dir / library_name(source)
    try:
        fd = _open_trusted_library(so_path)
    except UnsafeBuildPath as exc:
        warnings.warn(f"kernels: rebuilding {so_path.name}: {exc}", RuntimeWarning, stacklevel=3)
        so_path.unlink()
        fd = None
    if fd is None:
        tmp = so_path.with_name(f"{so_path.stem}.{os.getpid()}.{threading.get_ident()}.so")
        subprocess.run(
            ["cc", *_CFLAGS, "-I", str(source.parent), "-o", str(tmp), str(source), "-lm"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        os.chmod(tmp, 0o644)
        tmp.replace(so_path)
        fd = _open_trusted_library(so_path)
        if fd is None:
            raise OSError(f"{so_path} vanished after it was built")
    return so_path, fd


def _build_and_open(source: Path, build_dir: Path | None) -> ctypes.CDLL | None:
    try:
        so_path, fd = _built(source, build_dir)
        return _dlopen(fd, so_path)
    except UnsafeBuildPath as exc:
        warnings.warn(
            f"kernels: not loading native kernels ({exc}); using the PyTorch paths", RuntimeWarning, stacklevel=2
        )
        return None
    except (OSError, subprocess.SubprocessError):
        return None


def build_all(jobs: int | None = None) -> list[str]:
    """Builds every kernel of salon/kernels/cpu/ into the cache, `jobs` compilers at a time (default: one per CPU this
    process may run on), the largest sources (with what they include) first -- scripts/setup.sh and image builds run
    it, so that an engine's first start loads its kernels instead of compiling them one after another (about 50 s on
    2 cores, against about 35 s for all of them here); the names of those that failed."""

    def build(source: Path) -> str | None:
        try:
            os.close(_built(source, None)[1])
            return None
        except (OSError, subprocess.SubprocessError, UnsafeBuildPath):
            return source.name

    sources = sorted(
        Path(__file__).parent.glob("*.c"),
        key=lambda src: -sum(p.stat().st_size for p in [src, *_included_sources(src)]),
    )
    with ThreadPoolExecutor(jobs or len(os.sched_getaffinity(0))) as pool:
        return sorted(name for name in pool.map(build, sources) if name is not None)


if __name__ == "__main__":
    failed = build_all()
    print("built every CPU kernel" if not failed else f"could not build: {', '.join(failed)}")
