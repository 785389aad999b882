"""Reading a GGUF file: typed metadata with errors that name the key, tensors dequantized to float32.

The file is memory-mapped and its header parsed here (gguf-py's GGUFReader builds Python objects for every
element of every array, which takes tens of seconds for a 262,144-token vocabulary); gguf-py supplies the
format's constants and the dequantizers. Metadata keys follow llama.cpp's names (`general.architecture`,
`<arch>.block_count`, `tokenizer.ggml.tokens`, ...). A required key that is absent raises GGUFMetadataError
naming the key and the file; an optional key has a default. Tensors keep GGUF's names with the `.weight`
suffix dropped (`blk.3.attn_q`, `token_embd`, `output_norm`, `output`, `rope_freqs`); every weight type
gguf-py can dequantize is read (F32, F16, BF16, Q4_0/1, Q5_0/1, Q8_0, the K-quants, the IQ types), any
other raises UnsupportedTensorType naming the tensor and its type.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from gguf.quants import dequantize

from salon.engine.model.vocab import Vocab

_MISSING = object()
_MAGIC = b"GGUF"
_SCALARS = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
_NUMPY = {
    GGUFValueType.UINT8: np.uint8,
    GGUFValueType.INT8: np.int8,
    GGUFValueType.UINT16: np.uint16,
    GGUFValueType.INT16: np.int16,
    GGUFValueType.UINT32: np.uint32,
    GGUFValueType.INT32: np.int32,
    GGUFValueType.FLOAT32: np.float32,
    GGUFValueType.BOOL: np.bool_,
    GGUFValueType.UINT64: np.uint64,
    GGUFValueType.INT64: np.int64,
    GGUFValueType.FLOAT64: np.float64,
}


class GGUFMetadataError(ValueError):
    """A metadata key the model needs is absent or has an unusable value."""


class UnsupportedTensorType(ValueError):
    """A tensor is stored in a type that cannot be dequantized."""


@dataclass(frozen=True)
class TensorInfo:
    name: str  # without the ".weight" suffix
    full_name: str  # as stored
    shape: tuple[int, ...]  # numpy order: rows first ([out, in] for a Linear)
    type_name: str
    type_id: int
    offset_bytes: int  # from the start of the file
    num_bytes: int


class _Cursor:
    def __init__(self, buf: memoryview) -> None:
        self.buf = buf
        self.pos = 0

    def scalar(self, fmt: str):
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="surrogateescape")

    def value(self, kind: int):
        kind = GGUFValueType(kind)
        if kind == GGUFValueType.STRING:
            return self.string()
        if kind == GGUFValueType.ARRAY:
            elem, count = GGUFValueType(self.scalar("<I")), self.scalar("<Q")
            if elem == GGUFValueType.STRING:
                return [self.string() for _ in range(count)]
            if elem == GGUFValueType.ARRAY:
                return [self.value(GGUFValueType.ARRAY) for _ in range(count)]
            dtype = np.dtype(_NUMPY[elem]).newbyteorder("<")
            arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos)
            self.pos += count * dtype.itemsize
            return arr.tolist()
        return self.scalar(_SCALARS[kind])


class GGUFFile:
    """One open GGUF file (memory-mapped): metadata by key, tensors by name."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as fh:
            self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        cur = _Cursor(memoryview(self._map))
        if bytes(cur.buf[:4]) != _MAGIC:
            raise GGUFMetadataError(f"{self.path.name}: not a GGUF file (no GGUF magic)")
        cur.pos = 4
        self.version = cur.scalar("<I")
        if self.version not in (2, 3):
            raise GGUFMetadataError(f"{self.path.name}: GGUF version {self.version} is not supported (2 or 3)")
        num_tensors, num_kv = cur.scalar("<Q"), cur.scalar("<Q")
        self.fields: dict[str, Any] = {}
        for _ in range(num_kv):
            key = cur.string()
            self.fields[key] = cur.value(cur.scalar("<I"))
        infos = []
        for _ in range(num_tensors):
            name = cur.string()
            dims = [cur.scalar("<Q") for _ in range(cur.scalar("<I"))]
            infos.append((name, dims, cur.scalar("<I"), cur.scalar("<Q")))
        alignment = int(self.fields.get("general.alignment", 32))
        data_start = -(-cur.pos // alignment) * alignment
        self._tensors: dict[str, TensorInfo] = {}
        for name, dims, type_id, offset in infos:
            try:
                qtype = GGMLQuantizationType(type_id)
                type_name = qtype.name
                block, block_bytes = GGML_QUANT_SIZES[qtype]
            except (ValueError, KeyError):
                type_name, block, block_bytes = f"type id {type_id}", 1, 0
            count = int(np.prod(dims)) if dims else 1
            short = name.removesuffix(".weight")
            self._tensors[short] = TensorInfo(
                short,
                name,
                tuple(reversed(dims)),
                type_name,
                type_id,
                data_start + offset,
                count // block * block_bytes,
            )

    @property
    def architecture(self) -> str:
        return str(self.get("general.architecture"))

    def has(self, key: str) -> bool:
        return key in self.fields

    def get(self, key: str, default: Any = _MISSING) -> Any:
        """The value of `key` (str, int, float, bool or list); raises GGUFMetadataError when absent without default."""
        if key not in self.fields:
            if default is _MISSING:
                raise GGUFMetadataError(f"{self.path.name}: metadata key {key!r} is missing")
            return default
        return self.fields[key]

    def get_int(self, key: str, default: Any = _MISSING) -> int:
        """An integer key; a per-layer array must hold one value for every layer."""
        value = self.get(key, default)
        if isinstance(value, list):
            if len(set(value)) != 1:
                raise GGUFMetadataError(
                    f"{self.path.name}: metadata key {key!r} varies per layer ({value[:8]}), which is not supported"
                )
            value = value[0]
        return value if value is None else int(value)

    def get_float(self, key: str, default: Any = _MISSING) -> float:
        value = self.get(key, default)
        return value if value is None else float(value)

    # -- tensors

    def tensor_names(self) -> list[str]:
        return list(self._tensors)

    def has_tensor(self, name: str) -> bool:
        return name in self._tensors

    def tensor_info(self, name: str) -> TensorInfo:
        info = self._tensors.get(name)
        if info is None:
            raise GGUFMetadataError(f"{self.path.name}: tensor {name + '.weight'!r} is missing")
        return info

    def read_tensor(self, name: str) -> torch.Tensor:
        """Tensor `name` dequantized to float32, [rows, columns] ([out, in] for a Linear), in its own memory."""
        t = self.tensor_info(name)
        try:
            qtype = GGMLQuantizationType(t.type_id)
            block, block_bytes = GGML_QUANT_SIZES[qtype]
            raw = np.frombuffer(self._map, dtype=np.uint8, count=t.num_bytes, offset=t.offset_bytes)
            rows = int(np.prod(t.shape[:-1])) if len(t.shape) > 1 else 1
            arr = dequantize(raw.reshape(rows, t.shape[-1] // block * block_bytes), qtype)
        except (ValueError, KeyError, NotImplementedError):
            raise UnsupportedTensorType(
                f"{self.path.name}: tensor {t.full_name!r} has type {t.type_name}, which cannot be "
                "dequantized (weights may be F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, K- or IQ-quants)"
            ) from None
        return torch.from_numpy(np.array(arr, dtype=np.float32, order="C", copy=True).reshape(t.shape))


def open_gguf(path: Path | str) -> GGUFFile:
    return GGUFFile(path)


def default_gguf_path(cache_dir: Path | None = None) -> Path:
    """The packaged Gemma 3 270M GGUF (assembled once, its sha256 verified). Kept for callers of the old API."""
    from salon.engine.model.sources import resolve_source

    return resolve_source("gemma-3-270m", cache_dir).path


def read_vocab(f: GGUFFile) -> Vocab:
    """The tokenizer vocabulary and its settings from `tokenizer.ggml.*`."""
    model = str(f.get("tokenizer.ggml.model"))
    tokens = tuple(f.get("tokenizer.ggml.tokens"))
    n = len(tokens)
    types = tuple(int(t) for t in f.get("tokenizer.ggml.token_type", [1] * n))
    scores = tuple(float(s) for s in f.get("tokenizer.ggml.scores", [0.0] * n))
    merges = tuple(f.get("tokenizer.ggml.merges", ()))
    if model == "gpt2" and not merges:
        raise GGUFMetadataError(f"{f.path.name}: metadata key 'tokenizer.ggml.merges' is missing (a BPE vocabulary)")

    def special(name: str) -> int | None:
        value = f.get(f"tokenizer.ggml.{name}_token_id", None)
        return None if value is None else int(value)

    bos, eos = special("bos"), special("eos")
    if eos is None:
        raise GGUFMetadataError(f"{f.path.name}: metadata key 'tokenizer.ggml.eos_token_id' is missing")
    pre = str(f.get("tokenizer.ggml.pre", "default"))
    default_add_bos = model == "llama" or pre in ("llama3", "llama-v3", "llama-bpe", "tekken")
    return Vocab(
        tokens=tokens,
        scores=scores,
        types=types,
        bos_token_id=bos if bos is not None else eos,
        eos_token_id=eos,
        unk_token_id=special("unknown") if special("unknown") is not None else 0,
        pad_token_id=special("padding") if special("padding") is not None else eos,
        model=model,
        pre=pre,
        merges=merges,
        add_bos=bool(f.get("tokenizer.ggml.add_bos_token", default_add_bos)),
        eot_token_id=special("eot"),
        eom_token_id=special("eom"),
    )
