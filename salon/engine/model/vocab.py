"""A GGUF vocabulary (`tokenizer.ggml.*`): pieces, scores, token types, special ids and the BPE merges.

The tokenizer (tokenizer.py) and both fragment encoders (tokenizer_spm.py, tokenizer_bpe.py) read it.
"""

from __future__ import annotations

from dataclasses import dataclass

# GGUF token types (llama.cpp's llama_token_type).
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

# Token texts llama.cpp treats as end of generation wherever they occur in a vocabulary (its EOG list),
# besides the file's EOS / EOT / EOM ids.
END_OF_GENERATION_TEXTS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "<|end_of_text|>",
    "</s>",
)


@dataclass(frozen=True)
class Vocab:
    tokens: tuple[str, ...]
    scores: tuple[float, ...]
    types: tuple[int, ...]
    bos_token_id: int
    eos_token_id: int
    unk_token_id: int
    pad_token_id: int
    # `tokenizer.ggml.model`: "llama" (SentencePiece) or "gpt2" (byte-level BPE).
    model: str = "llama"
    # `tokenizer.ggml.pre`: the BPE pre-tokenizer (regex split) by llama.cpp's name.
    pre: str = "default"
    merges: tuple[str, ...] = ()
    # Whether a prompt starts with BOS (`tokenizer.ggml.add_bos_token`).
    add_bos: bool = True
    eot_token_id: int | None = None
    eom_token_id: int | None = None

    def end_of_generation_ids(self) -> tuple[int, ...]:
        """EOS, EOT, EOM and every token whose text is on llama.cpp's end-of-generation list, ascending."""
        ids = {self.eos_token_id}
        ids.update(i for i in (self.eot_token_id, self.eom_token_id) if i is not None)
        wanted = set(END_OF_GENERATION_TEXTS)
        ids.update(i for i, t in enumerate(self.tokens) if t in wanted)
        return tuple(sorted(ids))
