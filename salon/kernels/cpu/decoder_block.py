"""CPU fast path of salon.kernels.decoder_block: a Gemma 3 or Llama layer of a decode-sized step as one C call
(decoder_block.h), with the bits of the model's composition of the CPU family's ops.

It runs where the family's own kernels are the ones the C build holds -- the VNNI GEMMs with the AVX-512
attention and KV write (decoder_block_avx512.c), or the AVX2 ones (decoder_block_avx2.c) -- for up to MAX_ROWS
rows (with per-row weight scales on AVX2 the two-term rows are one call of the family's GEMV, which takes
GEMV_MAX_ROWS = 2 * MAX_ROWS), an int8 KV cache with scales, and head shapes the C attention takes. Anything else
returns None and the model composes the layer from the ops (the same bits, call by call). decoder_blocks_cpu
runs a step's layers in one C call the same way (18 calls of Python glue, RoPE tables and struct lookups a
Gemma step, about 0.7 ms of a 15 ms batch-1 step here, become one).

The C structs of a BlockWeights, BlockCache or BlockBatch are built once per object and kept while it lives,
so a call costs a dictionary lookup per holder and one ctypes call.
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Sequence
from pathlib import Path

import torch

from salon.kernels.cpu import native
from salon.kernels.cpu.linear_two_terms import MAX_ROWS
from salon.kernels.cpu.paged_attention import c_kernel_supports
from salon.kernels.cpu.rope import rope_tables
from salon.kernels.cpu.w8a8_grouped import chosen_isa, packed_weights
from salon.kernels.decoder_block import BlockBatch, BlockCache, BlockWeights
from salon.kernels.quantize import SCALE_FLOOR
from salon.kernels.w8a8_grouped import GROUP

_P, _I = ctypes.c_void_p, ctypes.c_int64


class _Weights(ctypes.Structure):
    _fields_ = (
        [
            (n, _I)
            for n in (
                "d_model",
                "num_heads",
                "num_kv_heads",
                "head_dim",
                "ffn_dim",
                "writes_kv",
                "sliding_window",
                "per_row_scales",
                "activation",
                "int16_activations",
                "group32_activations",
            )
        ]
        + [("eps", ctypes.c_double), ("sm_scale", ctypes.c_float)]
        + [
            (n, _P)
            for n in (
                "attn_norm",
                "q_norm",
                "k_norm",
                "post_attention_norm",
                "ffn_norm",
                "post_ffw_norm",
                "qkv_w",
                "o_w",
                "gate_up_w",
                "down_w",
                "qkv_s",
                "o_s",
                "gate_up_s",
                "down_s",
            )
        ]
    )


class _Cache(ctypes.Structure):
    _fields_ = [("k_cache", _P), ("v_cache", _P), ("k_scale", _P), ("v_scale", _P), ("block_size", _I)]


class _Batch(ctypes.Structure):
    _fields_ = [(n, _I) for n in ("num_tokens", "num_seqs", "max_blocks")] + [
        (n, _P) for n in ("positions", "slot_mapping", "block_tables", "query_start_loc", "seq_lens", "row_seq")
    ]


_P3 = ctypes.POINTER(_Weights), ctypes.POINTER(_Cache), ctypes.POINTER(_Batch)
_ARGS = ([*_P3, _P, _P, _P, ctypes.c_float, ctypes.c_int], ctypes.c_int)
# the step's layers: n, then arrays of n pointers (weights, cache, batch, cos, sin), x, scale floor, threads
_LAYERS_ARGS = ([_I, _P, _P, _P, _P, _P, _P, ctypes.c_float, ctypes.c_int], _I)
# build -> (source, its entry point for one layer, the one for the step's layers)
_KERNELS = {
    "avx512": (Path(__file__).with_name("decoder_block_avx512.c"), "decoder_block_avx512", "decoder_blocks_avx512"),
    "avx2": (Path(__file__).with_name("decoder_block_avx2.c"), "decoder_block_avx2", "decoder_blocks_avx2"),
}
_SIGNATURES = {build: {one: _ARGS, layers: _LAYERS_ARGS} for build, (_, one, layers) in _KERNELS.items()}
# The build that holds the CPU family's kernels: (grouped GEMM isa, SIMD isa of attention and the KV write).
_BUILDS = {("vnni", "avx512"): "avx512", ("avx2", "avx2"): "avx2"}
_ACTIVATIONS = {"gelu_tanh": 0, "silu": 1}  # decoder_block.h's BLOCK_GEGLU, BLOCK_SWIGLU

# holder -> its C struct (None: the holder's tensors are not what the C call takes); kept while the holder lives
_structs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_entry: list = []  # the loaded entry points (one layer, the step's layers), once looked up ([None] where none runs)


def build() -> str | None:
    """The C build that runs the CPU family's kernels on this CPU ("avx512", "avx2"), or None (e.g. AVX-512
    without VNNI: the family's GEMM and attention are of two builds no library holds together)."""
    return _BUILDS.get((chosen_isa(), native.simd_isa()))


def library() -> ctypes.CDLL | None:
    chosen = build()
    return native.load(_KERNELS[chosen][0], _SIGNATURES[chosen]) if chosen else None


def _entry_points():
    if not _entry:
        lib = library()
        _, one, layers = _KERNELS[build()]
        _entry.append(None if lib is None else (getattr(lib, one), getattr(lib, layers)))
    return _entry[0]


def _f32(t: torch.Tensor, *shape: int) -> bool:
    return t.dtype == torch.float32 and tuple(t.shape) == shape and t.is_contiguous() and t.device.type == "cpu"


def _linear(w: torch.Tensor, s: torch.Tensor, n: int, k: int, per_row: bool) -> bool:
    return (
        w.dtype == torch.int8
        and tuple(w.shape) == (n, k)
        and w.is_contiguous()
        and w.device.type == "cpu"
        and (_f32(s, n) if per_row else k % GROUP == 0 and _f32(s, n, k // GROUP))
    )


def _weights_struct(w: BlockWeights) -> _Weights | None:
    hq, hkv, d_head, f = w.num_heads, w.num_kv_heads, w.head_dim, w.ffn_dim
    d = w.attn_norm.shape[0] if w.attn_norm.dim() == 1 else -1
    n_qkv = (hq + 2 * hkv) * d_head if w.writes_kv else hq * d_head
    per_row = w.qkv_s.dim() == 1
    if (w.int16_activations or w.group32_activations) and per_row:
        return None  # the int16 and group32 GEMMs take grouped scales only
    optional = (
        (w.q_norm, d_head),
        (w.k_norm if w.writes_kv else None, d_head),
        (w.post_attention_norm, d),
        (w.post_ffw_norm, d),
    )
    ok = (
        d > 0
        and c_kernel_supports(hq, hkv, d_head)
        and d_head % 2 == 0
        and w.activation in _ACTIVATIONS
        and (not w.writes_kv or (w.q_norm is None) == (w.k_norm is None))
        and all(_f32(t, d) for t in (w.attn_norm, w.ffn_norm))
        and all(t is None or _f32(t, n) for t, n in optional)
        and _linear(w.qkv_w, w.qkv_s, n_qkv, d, per_row)
        and _linear(w.o_w, w.o_s, d, hq * d_head, per_row)
        and _linear(w.gate_up_w, w.gate_up_s, 2 * f, d, per_row)
        and _linear(w.down_w, w.down_s, d, f, per_row)
    )
    if not ok:
        return None
    ptr = {
        n: getattr(w, n).data_ptr()
        for n in ("attn_norm", "ffn_norm", "qkv_w", "o_w", "gate_up_w", "down_w", "qkv_s", "o_s", "gate_up_s", "down_s")
    }
    # two-term and group32 grouped Linears in the VNNI build read their packed copies (scale pointer NULL: the scales
    # inside)
    # (the struct holds them: they outlive a repacking of weights changed in place, which the struct ignores)
    packed = []
    if build() == "avx512" and not per_row and not w.int16_activations:
        for lin in ("qkv", "o", "gate_up", "down"):
            p = packed_weights(getattr(w, f"{lin}_w"), getattr(w, f"{lin}_s"))
            if p is not None:
                packed.append(p)
                ptr[f"{lin}_w"], ptr[f"{lin}_s"] = p.data_ptr(), None
    ptr.update(
        {
            n: None if getattr(w, n) is None else getattr(w, n).data_ptr()
            for n in ("q_norm", "post_attention_norm", "post_ffw_norm")
        }
    )
    struct = _Weights(
        d_model=d,
        num_heads=hq,
        num_kv_heads=hkv,
        head_dim=d_head,
        ffn_dim=f,
        writes_kv=int(w.writes_kv),
        sliding_window=w.sliding_window or 0,
        per_row_scales=int(per_row),
        activation=_ACTIVATIONS[w.activation],
        int16_activations=int(w.int16_activations),
        group32_activations=int(w.group32_activations),
        eps=w.eps,
        sm_scale=w.sm_scale,
        k_norm=w.k_norm.data_ptr() if w.writes_kv and w.k_norm is not None else None,
        **ptr,
    )
    struct.packed = packed
    return struct


def _cache_struct(c: BlockCache) -> _Cache | None:
    k = c.k_cache
    if k.dim() != 4 or k.device.type != "cpu":
        return None
    nb, bs, hkv, _ = k.shape
    ok = (
        all(t.dtype == torch.int8 and t.shape == k.shape and t.is_contiguous() for t in (c.k_cache, c.v_cache))
        and c.k_scale is not None
        and c.v_scale is not None
        and _f32(c.k_scale, nb, bs, hkv)
        and _f32(c.v_scale, nb, bs, hkv)
    )
    return (
        _Cache(
            k_cache=k.data_ptr(),
            v_cache=c.v_cache.data_ptr(),
            k_scale=c.k_scale.data_ptr(),
            v_scale=c.v_scale.data_ptr(),
            block_size=bs,
        )
        if ok
        else None
    )


def _batch_struct(b: BlockBatch) -> _Batch | None:
    t = b.positions.shape[0] if b.positions.dim() == 1 else 0
    s = b.seq_lens.shape[0] if b.seq_lens.dim() == 1 else 0

    def vec(x: torch.Tensor, dtype: torch.dtype, n: int) -> bool:
        return x.dtype == dtype and tuple(x.shape) == (n,) and x.is_contiguous() and x.device.type == "cpu"

    ok = (
        t > 0
        and s > 0
        and vec(b.positions, torch.int64, t)
        and vec(b.slot_mapping, torch.int64, t)
        and vec(b.query_start_loc, torch.int32, s + 1)
        and vec(b.seq_lens, torch.int32, s)
        and vec(b.row_seq, torch.int32, t)
        and b.block_tables.dtype == torch.int32
        and b.block_tables.dim() == 2
        and b.block_tables.shape[0] == s
        and b.block_tables.is_contiguous()
    )
    if not ok:
        return None
    return _Batch(
        num_tokens=t,
        num_seqs=s,
        max_blocks=b.block_tables.shape[1],
        positions=b.positions.data_ptr(),
        slot_mapping=b.slot_mapping.data_ptr(),
        block_tables=b.block_tables.data_ptr(),
        query_start_loc=b.query_start_loc.data_ptr(),
        seq_lens=b.seq_lens.data_ptr(),
        row_seq=b.row_seq.data_ptr(),
    )


def _struct(holder, make):
    try:
        return _structs[holder]
    except KeyError:
        struct = _structs[holder] = make(holder)
        return struct


def decoder_block_cpu(
    x: torch.Tensor, weights: BlockWeights, cache: BlockCache, batch: BlockBatch
) -> torch.Tensor | None:
    """The layer's output f32[T, d_model] (a new tensor), or None where the C call does not take these
    arguments (the model composes the layer)."""
    entries = _entry_points() if _takes_rows(x) else None
    args = None if entries is None else _layer_args(x, weights, cache, batch)
    if args is None:
        return None
    out = x.contiguous().clone()
    w, c, b, cos, sin = args
    if entries[0](
        ctypes.byref(w),
        ctypes.byref(c),
        ctypes.byref(b),
        cos.data_ptr(),
        sin.data_ptr(),
        out.data_ptr(),
        SCALE_FLOOR,
        torch.get_num_threads(),
    ):
        return None
    return out


def _takes_rows(x: torch.Tensor) -> bool:
    return x.dim() == 2 and 1 <= x.shape[0] <= MAX_ROWS and x.dtype == torch.float32 and x.device.type == "cpu"


def _layer_args(x: torch.Tensor, weights: BlockWeights, cache: BlockCache, batch: BlockBatch):
    """The C structs and RoPE tables of one layer for x, or None where the C call does not take them."""
    w, c, b = _struct(weights, _weights_struct), _struct(cache, _cache_struct), _struct(batch, _batch_struct)
    if (
        w is None
        or c is None
        or b is None
        or b.num_tokens != x.shape[0]
        or x.shape[1] != w.d_model
        or batch.max_position < 0
    ):
        return None
    cos, sin = rope_tables(weights.head_dim, weights.rope_base, batch.max_position + 1)
    return w, c, b, cos, sin


def decoder_blocks_cpu(
    x: torch.Tensor, layers: Sequence[tuple[BlockWeights, BlockCache, BlockBatch]]
) -> tuple[torch.Tensor, int]:
    """The step's layers in one C call, as decoder_block_cpu would run them one by one: (the output of the last
    layer done, a new tensor, or x where none was; how many were done). The call takes the layers up to the
    first whose arguments it does not take, and stops early where one computes nothing."""
    entries = _entry_points() if layers and _takes_rows(x) else None
    if entries is None:
        return x, 0
    taken = []
    for weights, cache, batch in layers:
        args = _layer_args(x, weights, cache, batch)
        if args is None:
            break
        taken.append(args)
    if not taken:
        return x, 0
    out = x.contiguous().clone()
    done = _call_layers(entries[1], taken, out, torch.get_num_threads())
    return (out, done) if done else (x, 0)


def _call_layers(entry, taken: list, out: torch.Tensor, nthreads: int) -> int:
    """The C call for the step's layers on `out` (in place), each layer's (_layer_args) structs and RoPE tables
    passed as arrays of pointers: how many layers it did."""
    n = len(taken)
    arrays = [(ctypes.c_void_p * n)(*(ctypes.addressof(args[i]) for args in taken)) for i in range(3)]
    arrays += [(ctypes.c_void_p * n)(*(args[i].data_ptr() for args in taken)) for i in (3, 4)]
    return entry(n, *arrays, out.data_ptr(), SCALE_FLOOR, nthreads)
