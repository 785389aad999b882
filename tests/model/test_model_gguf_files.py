"""Random-weight GGUFs of both architectures written with gguf-py: they load (config from the metadata), match a
plain reference that reads the file with gguf-py's own reader, generate; bad files get errors that name the
key or tensor."""

from __future__ import annotations

import math

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize

from salon.engine.model import DenseAttention, load
from salon.engine.model.chat_renderer import TemplateMessage
from salon.engine.model.gguf_file import GGUFMetadataError, UnsupportedTensorType, open_gguf
from salon.engine.model.models.common import UnsupportedModelFile
from tests.model.gguf_files import write_gemma3_gguf, write_llama_gguf

WEIGHT_TYPES = {
    "attn_q": "Q8_0",
    "attn_k": "Q4_0",
    "attn_v": "Q4_1",
    "attn_output": "Q5_0",
    "ffn_gate": "Q5_1",
    "ffn_up": "F16",
    "ffn_down": "BF16",
    "token_embd": "Q8_0",
}


def gguf_py_tensors(path) -> dict[str, np.ndarray]:
    """The file's tensors through gguf-py's GGUFReader, dequantized (float64)."""
    reader = gguf.GGUFReader(str(path))
    return {
        t.name.removesuffix(".weight"): dequantize(t.data, t.tensor_type)
        .astype(np.float64)
        .reshape(tuple(reversed([int(d) for d in t.shape])))
        for t in reader.tensors
    }


def llama_cpp_reference(path, ids: list[int]) -> torch.Tensor:
    """llama.cpp's llama graph in float64 on the tensors as stored: RoPE on adjacent pairs (2i, 2i + 1)."""
    r = gguf.GGUFReader(str(path))
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.")}
    w = {k: torch.from_numpy(v) for k, v in gguf_py_tensors(path).items()}
    n_layer, hq, hkv = (
        meta["llama.block_count"],
        meta["llama.attention.head_count"],
        meta["llama.attention.head_count_kv"],
    )
    eps, base = meta["llama.attention.layer_norm_rms_epsilon"], meta["llama.rope.freq_base"]
    d = w["token_embd"].shape[1]
    hd, t = d // hq, len(ids)

    def norm(x, weight):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight

    def rope_adjacent(x):
        out = x.clone()
        for pos in range(t):
            for i in range(hd // 2):
                ang = pos * base ** (-2 * i / hd)
                c, s = math.cos(ang), math.sin(ang)
                a, b = x[pos, :, 2 * i], x[pos, :, 2 * i + 1]
                out[pos, :, 2 * i], out[pos, :, 2 * i + 1] = a * c - b * s, a * s + b * c
        return out

    x = w["token_embd"][torch.tensor(ids)]
    for li in range(n_layer):
        p = f"blk.{li}."
        h = norm(x, w[p + "attn_norm"])
        q = rope_adjacent((h @ w[p + "attn_q"].T).view(t, hq, hd))
        k = rope_adjacent((h @ w[p + "attn_k"].T).view(t, hkv, hd))
        v = (h @ w[p + "attn_v"].T).view(t, hkv, hd)
        o = torch.zeros(t, hq, hd, dtype=torch.float64)
        for pos in range(t):
            for head in range(hq):
                g = head // (hq // hkv)
                probs = torch.softmax(k[: pos + 1, g] @ q[pos, head] / math.sqrt(hd), 0)
                o[pos, head] = probs @ v[: pos + 1, g]
        x = x + o.reshape(t, d) @ w[p + "attn_output"].T
        h = norm(x, w[p + "ffn_norm"])
        x = x + (torch.nn.functional.silu(h @ w[p + "ffn_gate"].T) * (h @ w[p + "ffn_up"].T)) @ w[p + "ffn_down"].T
    x = norm(x, w["output_norm"])
    return x @ w.get("output", w["token_embd"]).T


@pytest.fixture(scope="module")
def llama_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama") / "tiny-llama.gguf"
    write_llama_gguf(path, tensor_types=WEIGHT_TYPES)
    return path


@pytest.fixture(scope="module")
def gemma_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma") / "tiny-gemma3.gguf"
    write_gemma3_gguf(path)
    return path


def test_every_weight_type_reads_as_gguf_py_dequantizes_it(llama_file):
    ours = open_gguf(llama_file)
    assert {ours.tensor_info(n).type_name for n in ours.tensor_names()} == {*WEIGHT_TYPES.values(), "F32"}
    for name, arr in gguf_py_tensors(llama_file).items():
        assert np.array_equal(ours.read_tensor(name).numpy().astype(np.float64), arr), name


def test_llama_matches_llama_cpp_semantics_on_the_stored_weights(llama_file, tmp_path):
    loaded = load(str(llama_file), precision="float32", cache_dir=tmp_path, progress=False)
    cfg = loaded.model.config
    assert (cfg.architecture, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == ("llama", 2, 4, 2, 16)
    assert not cfg.tied_embeddings and cfg.eos_token_ids == (0, 2)
    ids = loaded.tokenizer.encode("hello world, hello there", parse_special=False)
    assert len(ids) > 10
    attn = DenseAttention(cfg)
    logits = loaded.model.logits(loaded.model.forward(torch.tensor(ids), attn.begin_step([len(ids)]), attn))
    ref = llama_cpp_reference(llama_file, ids)
    torch.testing.assert_close(logits.double(), ref, atol=2e-4, rtol=2e-4)


def greedy(model, ids: list[int], steps: int, kv_int8: bool) -> list[int]:
    attn = DenseAttention(model.config, kv_int8=kv_int8)
    hidden = model.forward(torch.tensor(ids), attn.begin_step([len(ids)]), attn)
    out = [int(model.logits(hidden[-1:]).argmax())]
    for _ in range(steps - 1):
        hidden = model.forward(torch.tensor(out[-1:]), attn.begin_step([1]), attn)
        out.append(int(model.logits(hidden).argmax()))
    return out


@pytest.mark.parametrize("which", ["llama", "gemma"])
def test_both_architectures_load_and_generate_in_both_precisions(which, llama_file, gemma_file, tmp_path):
    path = llama_file if which == "llama" else gemma_file
    fp = load(str(path), precision="float32", cache_dir=tmp_path, progress=False)
    q = load(str(path), precision="int8", cache_dir=tmp_path, progress=False)
    assert q.model.precision == "int8" and q.model.config == fp.model.config
    ids = fp.chat.render([TemplateMessage("user", "hi the world")]).token_ids
    for loaded, kv in ((fp, False), (q, True)):
        toks = greedy(loaded.model, ids, 6, kv)
        assert len(toks) == 6 and all(0 <= t < loaded.model.config.vocab_size for t in toks)
        # decoding one token at a time gives what the whole sequence gives
        attn = DenseAttention(loaded.model.config, kv_int8=kv)
        full = loaded.model.forward(torch.tensor(ids + toks[:-1]), attn.begin_step([len(ids) + 5]), attn)
        assert int(loaded.model.logits(full[-1:]).argmax()) == toks[-1]
    attn_f, attn_q = DenseAttention(fp.model.config), DenseAttention(q.model.config, kv_int8=True)
    hf = fp.model.forward(torch.tensor(ids), attn_f.begin_step([len(ids)]), attn_f)
    hq = q.model.forward(torch.tensor(ids), attn_q.begin_step([len(ids)]), attn_q)
    assert torch.nn.functional.cosine_similarity(hf, hq, dim=-1).min() > 0.98


def test_gemma3_layers_from_the_metadata(gemma_file, tmp_path):
    from salon.engine.model.loader import open_model_file

    cfg = open_model_file(str(gemma_file), tmp_path).config
    assert [s.attention for s in cfg.layers] == ["sliding"] * 5 + ["global"]
    assert {s.sliding_window_tokens for s in cfg.layers[:5]} == {8}
    assert [s.rope_base for s in cfg.layers] == [10000.0] * 5 + [1e6]
    assert (cfg.head_dim, cfg.attn_scale, cfg.embedding_multiplier) == (32, 1 / math.sqrt(32), 8.0)
    assert cfg.eos_token_ids == (1, 5)  # <eos> and <end_of_turn>


def test_a_missing_metadata_key_is_named(tmp_path):
    path = tmp_path / "no-eps.gguf"
    write_llama_gguf(path, omit_keys=("llama.attention.layer_norm_rms_epsilon",))
    with pytest.raises(GGUFMetadataError, match="llama.attention.layer_norm_rms_epsilon"):
        load(str(path), precision="float32", cache_dir=tmp_path, progress=False)


def test_an_unsupported_tensor_type_names_the_tensor_and_type(tmp_path):
    path = tmp_path / "f64.gguf"
    write_llama_gguf(path, tensor_types={"ffn_down": "F64"})
    with pytest.raises(UnsupportedTensorType, match=r"'blk\.0\.ffn_down\.weight' has type F64"):
        load(str(path), precision="float32", cache_dir=tmp_path, progress=False)


def test_an_unknown_tensor_is_named(tmp_path):
    path = tmp_path / "bias.gguf"
    write_llama_gguf(path, extra_tensors=("blk.1.attn_q.bias",))
    with pytest.raises(UnsupportedModelFile, match=r"blk\.1\.attn_q\.bias"):
        load(str(path), precision="float32", cache_dir=tmp_path, progress=False)


def test_an_unknown_architecture_and_a_missing_file_are_named(tmp_path):
    from salon.engine.model.models import UnsupportedArchitecture
    from salon.engine.model.sources import ModelNotFound

    path = tmp_path / "other.gguf"
    writer = gguf.GGUFWriter(str(path), arch="mamba")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedArchitecture, match="'mamba'"):
        load(str(path), precision="float32", cache_dir=tmp_path, progress=False)
    with pytest.raises(ModelNotFound, match="no such file"):
        load(str(tmp_path / "absent.gguf"), cache_dir=tmp_path)
    with pytest.raises(ModelNotFound, match="smollm2-135m-instruct"):
        load("no-such-model", cache_dir=tmp_path)
