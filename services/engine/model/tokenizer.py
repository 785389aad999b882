"""SentencePiece tokenizer rebuilt from a GGUF vocabulary (tokens, scores, types).

Encoding follows llama.cpp's SPM path: the text is first split on special pieces (user-defined
pieces always, control pieces only when ``parse_special``; longest piece first, leftmost match),
then each plain fragment is encoded by a SentencePiece BPE model built from the same vocabulary
(spaces escaped to U+2581, no dummy prefix, byte fallback for unknown characters).
Decoding maps every id to its bytes and decodes UTF-8 once, so ``decode(encode(t)) == t``.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as spm_pb2

# GGUF token types (llama.cpp's llama_token_type).
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6
_SPACE = "\u2581"


@dataclass(frozen=True)
class Vocab:
    tokens: tuple[str, ...]
    scores: tuple[float, ...]
    types: tuple[int, ...]
    bos_token_id: int
    eos_token_id: int
    unk_token_id: int
    pad_token_id: int


def _build_sentencepiece(vocab: Vocab) -> spm.SentencePieceProcessor:
    proto = spm_pb2.ModelProto()
    proto.trainer_spec.model_type = spm_pb2.TrainerSpec.BPE
    proto.trainer_spec.vocab_size = len(vocab.tokens)
    proto.trainer_spec.byte_fallback = True
    proto.trainer_spec.unk_id = vocab.unk_token_id
    proto.trainer_spec.bos_id = vocab.bos_token_id
    proto.trainer_spec.eos_id = vocab.eos_token_id
    proto.trainer_spec.pad_id = vocab.pad_token_id
    proto.normalizer_spec.name = "identity"
    proto.normalizer_spec.add_dummy_prefix = False
    proto.normalizer_spec.remove_extra_whitespaces = False
    proto.normalizer_spec.escape_whitespaces = True
    type_map = {
        TOKEN_NORMAL: spm_pb2.ModelProto.SentencePiece.NORMAL,
        TOKEN_UNKNOWN: spm_pb2.ModelProto.SentencePiece.UNKNOWN,
        TOKEN_CONTROL: spm_pb2.ModelProto.SentencePiece.CONTROL,
        # Special pieces are split off before SentencePiece runs; inside it they must never match.
        TOKEN_USER_DEFINED: spm_pb2.ModelProto.SentencePiece.UNUSED,
        TOKEN_UNUSED: spm_pb2.ModelProto.SentencePiece.UNUSED,
        TOKEN_BYTE: spm_pb2.ModelProto.SentencePiece.BYTE,
    }
    for i, (piece, score, kind) in enumerate(zip(vocab.tokens, vocab.scores, vocab.types)):
        p = proto.pieces.add()
        p.piece = piece
        p.score = score
        p.type = spm_pb2.ModelProto.SentencePiece.UNKNOWN if i == vocab.unk_token_id else type_map[kind]
    return spm.SentencePieceProcessor(model_proto=proto.SerializeToString())


class Tokenizer:
    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self.vocab_size = len(vocab.tokens)
        self.bos_token_id = vocab.bos_token_id
        self.eos_token_id = vocab.eos_token_id
        self.unk_token_id = vocab.unk_token_id
        self.pad_token_id = vocab.pad_token_id
        self._sp = _build_sentencepiece(vocab)
        self._user_defined = self._specials({TOKEN_USER_DEFINED})
        self._all_specials = self._specials({TOKEN_USER_DEFINED, TOKEN_CONTROL})
        self._piece_bytes = [self._bytes_of(i) for i in range(self.vocab_size)]
        self._special_ids = frozenset(i for i, t in enumerate(vocab.types) if t == TOKEN_CONTROL)

    def token_id(self, piece: str) -> int:
        return self.vocab.tokens.index(piece)

    def _specials(self, kinds: set[int]) -> list[tuple[str, int]]:
        found = [(p, i) for i, (p, t) in enumerate(zip(self.vocab.tokens, self.vocab.types)) if t in kinds and p]
        return sorted(found, key=lambda pi: (-len(pi[0]), pi[1]))

    def _bytes_of(self, token_id: int) -> bytes:
        piece, kind = self.vocab.tokens[token_id], self.vocab.types[token_id]
        if kind == TOKEN_BYTE:
            return bytes([int(piece[3:-1], 16)])
        return piece.replace(_SPACE, " ").encode("utf-8")

    def _partition(self, text: str, specials: list[tuple[str, int]]) -> list[str | int]:
        """Split text into plain fragments (str) and special ids (int), longest special first."""
        fragments: list[str | int] = [text]
        for piece, token_id in specials:
            out: list[str | int] = []
            for frag in fragments:
                if isinstance(frag, int) or piece not in frag:
                    out.append(frag)
                    continue
                parts = frag.split(piece)
                for j, part in enumerate(parts):
                    if j:
                        out.append(token_id)
                    if part:
                        out.append(part)
            fragments = out
        return fragments

    def encode(self, text: str, add_bos: bool = True, parse_special: bool = True) -> list[int]:
        ids = [self.bos_token_id] if add_bos else []
        specials = self._all_specials if parse_special else self._user_defined
        for frag in self._partition(text, specials):
            if isinstance(frag, int):
                ids.append(frag)
            else:
                ids.extend(self._sp.encode(frag, out_type=int))
        return ids

    def token_bytes(self, token_id: int) -> bytes:
        return self._piece_bytes[token_id]

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        data = b"".join(
            self._piece_bytes[i] for i in ids if not (skip_special and i in self._special_ids))
        return data.decode("utf-8", errors="replace")


class IncrementalDetokenizer:
    """Streams text deltas for a growing id sequence; holds back incomplete UTF-8 sequences.

    Every delta is valid text: a multi-byte character split over byte-fallback tokens is emitted
    only once complete; bytes that can never form a character become U+FFFD.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        if self._skip_special and self._tokenizer.is_special(token_id):
            return ""
        return self._decoder.decode(self._tokenizer.token_bytes(token_id))

    def flush(self) -> str:
        """End of stream: any held-back partial character becomes U+FFFD."""
        return self._decoder.decode(b"", final=True)
