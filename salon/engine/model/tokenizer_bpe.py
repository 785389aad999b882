"""Byte-level BPE fragment encoder (`tokenizer.ggml.model = gpt2`), built with Hugging Face `tokenizers`.

A fragment (no special piece in it) is cut into words by the regexes llama.cpp uses for the file's
`tokenizer.ggml.pre` (applied in order; both the matches and the text between them become words), each
word is mapped byte by byte to GPT-2's printable alphabet, and the merges of the GGUF are applied by
`tokenizers`' BPE model. Some pre-tokenizers ("ignore merges") take a word that is itself a vocabulary
piece whole. Decoding maps each character of a piece back to its byte.
"""

from __future__ import annotations

from tokenizers import Regex, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from salon.engine.model.vocab import TOKEN_CONTROL, TOKEN_USER_DEFINED, Vocab

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?"
    r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# (regexes applied in order, ignore merges) per llama.cpp pre-tokenizer family.
_FAMILIES: dict[str, tuple[tuple[str, ...], bool]] = {
    "default": ((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"), False),
    "gpt2": ((_GPT2,), False),
    "digits+gpt2": ((r"\p{N}", _GPT2), False),
    "llama3": ((_LLAMA3,), True),
    "llama3-merges": ((_LLAMA3,), False),
    "qwen2": ((_QWEN2,), False),
    "tekken": ((_TEKKEN,), True),
    "gpt4o": ((_GPT4O,), False),
    "falcon": ((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"), False),
}
# tokenizer.ggml.pre -> family (llama.cpp's names).
PRE_TOKENIZERS = {
    "default": "default",
    **{
        name: "gpt2"
        for name in (
            "gpt-2",
            "gpt2",
            "phi-2",
            "mpt",
            "olmo",
            "jais",
            "exaone4",
            "trillion",
            "jina-es",
            "jina-de",
            "jina-v1-en",
            "jina-v2-code",
            "roberta-bpe",
            "gigachat",
            "granite-docling",
        )
    },
    **{
        name: "digits+gpt2"
        for name in ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b")
    },
    **{
        name: "llama3"
        for name in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2")
    },
    **{name: "llama3-merges" for name in ("dbrx", "smaug-bpe", "chatglm-bpe", "glm4")},
    **{name: "qwen2" for name in ("qwen2", "deepseek-r1-qwen", "stablelm2", "megrez", "hunyuan")},
    "tekken": "tekken",
    **{name: "gpt4o" for name in ("gpt-4o", "llama4")},
    "falcon": "falcon",
}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (printable Latin-1 bytes map to themselves)."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_BYTE_OF_CHAR = {c: b for b, c in _bytes_to_unicode().items()}


def pre_tokenizer_family(pre: str) -> str:
    family = PRE_TOKENIZERS.get(pre)
    if family is None:
        raise ValueError(
            f"tokenizer.ggml.pre = {pre!r} is not a supported BPE pre-tokenizer "
            f"(supported: {', '.join(sorted(PRE_TOKENIZERS))})"
        )
    return family


class ByteLevelBPEModel:
    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        regexes, ignore_merges = _FAMILIES[pre_tokenizer_family(vocab.pre)]
        ids = {}
        for i, piece in enumerate(vocab.tokens):
            ids.setdefault(piece, i)
        merges = [tuple(m.split(" ", 1)) for m in vocab.merges]
        bpe = models.BPE(vocab=ids, merges=merges, ignore_merges=ignore_merges)
        self._hf = HFTokenizer(bpe)
        self._hf.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )

    def encode(self, fragment: str) -> list[int]:
        return self._hf.encode(fragment, add_special_tokens=False).ids

    def token_bytes(self, token_id: int) -> bytes:
        piece, kind = self.vocab.tokens[token_id], self.vocab.types[token_id]
        if kind not in (TOKEN_CONTROL, TOKEN_USER_DEFINED):
            out = bytearray()
            for ch in piece:
                b = _BYTE_OF_CHAR.get(ch)
                out.extend(ch.encode("utf-8", errors="surrogateescape") if b is None else bytes([b]))
            return bytes(out)
        return piece.encode("utf-8", errors="surrogateescape")  # control and user-defined pieces: their text
