"""CPU fast path of sampling (temperature, top-k, top-p) for many rows at once, through sample.c: its AVX-512
build where the CPU has AVX-512 F and BW, else its AVX2 + FMA build (the same tokens). None where neither can
run (an older CPU, or no C compiler), and the caller samples with PyTorch instead."""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from salon.kernels.cpu import native

_C_SOURCE = Path(__file__).with_name("sample.c")
_ARGS = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2 + [ctypes.c_void_p] * 5 + [ctypes.c_int]
_SIGNATURES = {"sample_rows_avx512": _ARGS, "sample_rows_avx2": _ARGS}


def sample_rows_cpu(
    logits: torch.Tensor,
    rows: list[int],
    temperature: list[float],
    top_k: list[int],
    top_p: list[float],
    uniforms: list[float],
    isa: str | None = None,
    source: Path = _C_SOURCE,
) -> list[int] | None:
    """One token for each of `rows` of logits f32[R, V] (see sample.c for the rule); None where the kernel
    cannot run (or could not allocate its scratch). `isa` ("avx512" or "avx2") picks a build (tests); by
    default the best this CPU runs. `source`: a bench's variant of sample.c (bench.sampler's baseline)."""
    isa = native.simd_isa(isa)
    if isa is None or logits.dtype != torch.float32 or logits.device.type != "cpu":
        return None
    lib = native.load(source, _SIGNATURES)
    if lib is None:
        return None
    vocab = logits.shape[1]
    logits = logits.contiguous()
    row_ids = torch.tensor(rows, dtype=torch.int64)
    temps = torch.tensor(temperature, dtype=torch.float32)
    ks = torch.tensor(top_k, dtype=torch.int64)
    ps = torch.tensor(top_p, dtype=torch.float64)
    us = torch.tensor(uniforms, dtype=torch.float64)
    tokens = torch.empty(len(rows), dtype=torch.int64)
    getattr(lib, f"sample_rows_{isa}")(
        logits.data_ptr(),
        row_ids.data_ptr(),
        len(rows),
        vocab,
        temps.data_ptr(),
        ks.data_ptr(),
        ps.data_ptr(),
        us.data_ptr(),
        tokens.data_ptr(),
        torch.get_num_threads(),
    )
    out = tokens.tolist()
    return None if min(out, default=0) < 0 else out
