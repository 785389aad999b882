"""Small random-weight GGUF files of both architectures, written with gguf-py's GGUFWriter.

llama: a byte-level BPE vocabulary (the 256 byte symbols, a few merges, ChatML specials, pre-tokenizer
"smollm") and q/k rows stored the way llama.cpp's converter stores them (permuted for adjacent-pair RoPE).
gemma3: a SentencePiece vocabulary (byte fallback pieces plus a few words), no chat template.
`hf_q` / `hf_k` of the returned weights are the unpermuted (half-split RoPE) projections.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from salon.engine.model.tokenizer_bpe import _bytes_to_unicode

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _bpe_vocab() -> tuple[list[str], list[int], list[str]]:
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    symbols = list(_bytes_to_unicode().values())
    merges = ["h e", "l l", "Ġ t", "Ġt he", "o r", "Ġ w", "Ġw or", "l d"]
    merged = [m.replace(" ", "") for m in merges]
    tokens = specials + symbols + merged
    types = [3] * len(specials) + [1] * (len(symbols) + len(merged))
    return tokens, types, merges


def _spm_vocab() -> tuple[list[str], list[float], list[int]]:
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    words = [
        "\u2581",
        "\n",
        "e",
        "t",
        "a",
        "o",
        "h",
        "l",
        "r",
        "d",
        "w",
        "\u2581t",
        "he",
        "\u2581the",
        "ll",
        "\u2581w",
        "or",
        "\u2581wor",
        "ld",
        "\u2581world",
        "i",
        "\u2581hi",
    ]
    tokens = specials + bytes_ + words
    scores = [0.0] * (len(specials) + 256) + [-float(i) for i in range(len(words))]
    types = [3] * len(specials) + [6] * 256 + [1] * len(words)
    types[3] = 2  # <unk>
    return tokens, scores, types


def permute_for_gguf(w: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's converter: rows (head, half c, j) -> (head, j, c)."""
    rows = w.shape[0]
    return w.reshape(num_heads, 2, rows // num_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _add(writer: gguf.GGUFWriter, name: str, arr: np.ndarray, qtype: str) -> None:
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    kind = gguf.GGMLQuantizationType[qtype]
    if kind == gguf.GGMLQuantizationType.F32:
        writer.add_tensor(name, arr)
    elif kind == gguf.GGMLQuantizationType.F16:
        writer.add_tensor(name, arr.astype(np.float16))
    elif qtype == "F64":
        writer.add_tensor(name, arr.astype(np.float64))
    else:
        writer.add_tensor(name, gguf.quants.quantize(arr, kind), raw_dtype=kind)


def write_llama_gguf(
    path: Path,
    *,
    seed: int = 0,
    num_layers: int = 2,
    d_model: int = 64,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    ffn: int = 96,
    tied: bool = False,
    omit_keys: tuple[str, ...] = (),
    tensor_types: dict[str, str] | None = None,
    extra_tensors: tuple[str, ...] = (),
) -> dict:
    """A llama GGUF; tensor_types maps a tensor-name suffix (e.g. "attn_q") to a GGML type (default F32)."""
    rng = np.random.default_rng(seed)
    tokens, types, merges = _bpe_vocab()
    head_dim = d_model // num_heads
    types_of = tensor_types or {}
    w = gguf.GGUFWriter(str(path), arch="llama")
    keys = {
        "llama.block_count": lambda: w.add_block_count(num_layers),
        "llama.context_length": lambda: w.add_context_length(512),
        "llama.embedding_length": lambda: w.add_embedding_length(d_model),
        "llama.feed_forward_length": lambda: w.add_feed_forward_length(ffn),
        "llama.attention.head_count": lambda: w.add_head_count(num_heads),
        "llama.attention.head_count_kv": lambda: w.add_head_count_kv(num_kv_heads),
        "llama.rope.freq_base": lambda: w.add_rope_freq_base(10000.0),
        "llama.attention.layer_norm_rms_epsilon": lambda: w.add_layer_norm_rms_eps(1e-5),
        "llama.rope.dimension_count": lambda: w.add_rope_dimension_count(head_dim),
        "tokenizer.ggml.model": lambda: w.add_tokenizer_model("gpt2"),
        "tokenizer.ggml.pre": lambda: w.add_tokenizer_pre("smollm"),
        "tokenizer.ggml.tokens": lambda: w.add_token_list(tokens),
        "tokenizer.ggml.token_type": lambda: w.add_token_types(types),
        "tokenizer.ggml.merges": lambda: w.add_token_merges(merges),
        "tokenizer.ggml.bos_token_id": lambda: w.add_bos_token_id(1),
        "tokenizer.ggml.eos_token_id": lambda: w.add_eos_token_id(2),
        "tokenizer.ggml.add_bos_token": lambda: w.add_add_bos_token(False),
        "tokenizer.chat_template": lambda: w.add_chat_template(CHATML),
    }
    for key, add in keys.items():
        if key not in omit_keys:
            add()
    vocab = len(tokens)
    weights: dict[str, np.ndarray] = {}

    def mat(n, k):
        return (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    weights["token_embd"] = (0.5 * rng.standard_normal((vocab, d_model))).astype(np.float32)
    weights["output_norm"] = norm(d_model)
    if not tied:
        weights["output"] = mat(vocab, d_model)
    for i in range(num_layers):
        p = f"blk.{i}."
        weights[p + "attn_norm"], weights[p + "ffn_norm"] = norm(d_model), norm(d_model)
        weights[p + "hf_q"], weights[p + "hf_k"] = (
            mat(num_heads * head_dim, d_model),
            mat(num_kv_heads * head_dim, d_model),
        )
        weights[p + "attn_q"] = permute_for_gguf(weights[p + "hf_q"], num_heads)
        weights[p + "attn_k"] = permute_for_gguf(weights[p + "hf_k"], num_kv_heads)
        weights[p + "attn_v"] = mat(num_kv_heads * head_dim, d_model)
        weights[p + "attn_output"] = mat(d_model, num_heads * head_dim)
        weights[p + "ffn_gate"], weights[p + "ffn_up"] = mat(ffn, d_model), mat(ffn, d_model)
        weights[p + "ffn_down"] = mat(d_model, ffn)
    for name, arr in weights.items():
        if ".hf_" in name:
            continue
        suffix = name.split(".")[-1]
        _add(w, name + ".weight", arr, types_of.get(suffix, "F32"))
    for name in extra_tensors:
        _add(w, name, np.zeros(d_model, dtype=np.float32), "F32")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return weights


def write_gemma3_gguf(
    path: Path,
    *,
    seed: int = 0,
    num_layers: int = 6,
    d_model: int = 64,
    num_heads: int = 4,
    num_kv_heads: int = 1,
    head_dim: int = 32,
    ffn: int = 96,
    window: int = 8,
    tensor_types: dict[str, str] | None = None,
) -> dict:
    rng = np.random.default_rng(seed)
    tokens, scores, types = _spm_vocab()
    types_of = tensor_types or {}
    w = gguf.GGUFWriter(str(path), arch="gemma3")
    w.add_block_count(num_layers)
    w.add_context_length(1024)
    w.add_embedding_length(d_model)
    w.add_feed_forward_length(ffn)
    w.add_head_count(num_heads)
    w.add_head_count_kv(num_kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_sliding_window(window)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    weights: dict[str, np.ndarray] = {}

    def mat(n, k):
        return (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    weights["token_embd"] = (0.05 * rng.standard_normal((len(tokens), d_model))).astype(np.float32)
    weights["output_norm"] = norm(d_model)
    for i in range(num_layers):
        p = f"blk.{i}."
        for n in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            weights[p + n] = norm(d_model)
        weights[p + "attn_q_norm"], weights[p + "attn_k_norm"] = norm(head_dim), norm(head_dim)
        weights[p + "attn_q"] = mat(num_heads * head_dim, d_model)
        weights[p + "attn_k"] = mat(num_kv_heads * head_dim, d_model)
        weights[p + "attn_v"] = mat(num_kv_heads * head_dim, d_model)
        weights[p + "attn_output"] = mat(d_model, num_heads * head_dim)
        weights[p + "ffn_gate"], weights[p + "ffn_up"] = mat(ffn, d_model), mat(ffn, d_model)
        weights[p + "ffn_down"] = mat(d_model, ffn)
    for name, arr in weights.items():
        _add(w, name + ".weight", arr, types_of.get(name.split(".")[-1], "F32"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return weights
