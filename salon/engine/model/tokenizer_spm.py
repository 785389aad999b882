"""SentencePiece fragment encoder rebuilt from a GGUF vocabulary (tokens, scores, types): Gemma's tokenizer.

Follows llama.cpp's SPM path for a fragment that holds no special piece: a SentencePiece BPE model built
from the same vocabulary, spaces escaped to U+2581, no dummy prefix, byte fallback for unknown characters.
"""

from __future__ import annotations

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as spm_pb2

from salon.engine.model.vocab import (
    TOKEN_BYTE,
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    TOKEN_UNKNOWN,
    TOKEN_UNUSED,
    TOKEN_USER_DEFINED,
    Vocab,
)

_SPACE = "\u2581"


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


class SentencePieceModel:
    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self._sp = _build_sentencepiece(vocab)

    def encode(self, fragment: str) -> list[int]:
        return self._sp.encode(fragment, out_type=int)

    def token_bytes(self, token_id: int) -> bytes:
        piece, kind = self.vocab.tokens[token_id], self.vocab.types[token_id]
        if kind == TOKEN_BYTE:
            return bytes([int(piece[3:-1], 16)])
        return piece.replace(_SPACE, " ").encode("utf-8")
