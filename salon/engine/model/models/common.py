"""What the architecture files share: the attention geometry from the metadata, the tensor inventory check."""

from __future__ import annotations

import torch

from salon.engine.model.gguf_file import GGUFFile, GGUFMetadataError


class UnsupportedModelFile(ValueError):
    """The file uses a feature (a tensor, a metadata option) this implementation of its architecture lacks."""


def internal_name(gguf_name: str) -> str:
    """blk.3.attn_q -> layers.3.attn_q; token_embd -> embed; output_norm -> final_norm; output -> lm_head."""
    if gguf_name.startswith("blk."):
        return "layers." + gguf_name[len("blk.") :]
    return {"token_embd": "embed", "output_norm": "final_norm", "output": "lm_head"}.get(gguf_name, gguf_name)


def gguf_name(name: str) -> str:
    if name.startswith("layers."):
        name = "blk." + name[len("layers.") :]
    else:
        name = {"embed": "token_embd", "final_norm": "output_norm", "lm_head": "output"}.get(name, name)
    return name + ".weight"


def read_weights(
    f: GGUFFile, architecture: str, shapes: dict[str, tuple[int, ...]], optional: frozenset[str] = frozenset()
) -> dict[str, torch.Tensor]:
    """The tensors named in `shapes` (builder names), dequantized and shape-checked; any other tensor in the
    file is an error naming it (a silently ignored tensor would be a silently wrong model)."""
    present = {internal_name(n): n for n in f.tensor_names()}
    extra = sorted(f.tensor_info(present[n]).full_name for n in present if n not in shapes)
    if extra:
        raise UnsupportedModelFile(
            f"{f.path.name}: tensor {extra[0]!r} is not part of the {architecture} "
            f"architecture as implemented here ({len(extra)} such tensors)"
        )
    out = {}
    for name, shape in shapes.items():
        if name not in present:
            if name in optional:
                continue
            raise GGUFMetadataError(f"{f.path.name}: tensor {gguf_name(name)!r} is missing")
        info = f.tensor_info(present[name])
        if tuple(info.shape) != tuple(shape):
            raise GGUFMetadataError(
                f"{f.path.name}: tensor {info.full_name!r} has shape {list(info.shape)}, "
                f"the metadata implies {list(shape)}"
            )
        out[name] = f.read_tensor(present[name])
    return out


def attention_geometry(f: GGUFFile, arch: str) -> tuple[int, int, int, int]:
    """(d_model, num_heads, num_kv_heads, head_dim) from `<arch>.embedding_length` and `.attention.*`."""
    d_model = f.get_int(f"{arch}.embedding_length")
    num_heads = f.get_int(f"{arch}.attention.head_count")
    num_kv_heads = f.get_int(f"{arch}.attention.head_count_kv", num_heads)
    head_dim = f.get_int(f"{arch}.attention.key_length", d_model // num_heads)
    value_dim = f.get_int(f"{arch}.attention.value_length", head_dim)
    if value_dim != head_dim:
        raise UnsupportedModelFile(
            f"{f.path.name}: {arch}.attention.value_length {value_dim} differs from the key length {head_dim}"
        )
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise GGUFMetadataError(
            f"{f.path.name}: {arch}.attention.head_count {num_heads} is not a multiple of head_count_kv {num_kv_heads}"
        )
    if head_dim % 2:
        raise GGUFMetadataError(f"{f.path.name}: head dim {head_dim} is odd (RoPE rotates pairs)")
    return d_model, num_heads, num_kv_heads, head_dim


def rope_linear_scale(f: GGUFFile, arch: str) -> float:
    """The position multiplier of `<arch>.rope.scaling.*`: 1 without scaling, 1/factor for linear scaling."""
    kind = str(f.get(f"{arch}.rope.scaling.type", "none"))
    factor = f.get_float(f"{arch}.rope.scaling.factor", 1.0)
    if kind == "none" or factor in (0.0, 1.0):
        return 1.0
    if kind != "linear":
        raise UnsupportedModelFile(f"{f.path.name}: {arch}.rope.scaling.type = {kind!r} is not supported (linear)")
    return 1.0 / factor
