"""The tokenizer of a GGUF vocabulary: SentencePiece (`tokenizer.ggml.model = llama`, Gemma) or byte-level BPE
(`gpt2`: SmolLM, Llama 3, Qwen, ...), both with llama.cpp's special-token rules.

Encoding, as llama.cpp does it: the text is first split on special pieces -- user-defined pieces always,
control pieces only when ``parse_special`` -- longest piece first, leftmost match; each plain fragment is
then encoded by the vocabulary's model (tokenizer_spm.py, tokenizer_bpe.py). Decoding maps every id to its
bytes and decodes UTF-8 once, so ``decode(encode(t)) == t``; IncrementalDetokenizer streams the same bytes.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence

from salon.engine.model.tokenizer_bpe import ByteLevelBPEModel
from salon.engine.model.tokenizer_spm import SentencePieceModel
from salon.engine.model.vocab import TOKEN_CONTROL, TOKEN_USER_DEFINED, Vocab


def fragment_encoder(vocab: Vocab) -> SentencePieceModel | ByteLevelBPEModel:
    """The encoder of plain fragments for the vocabulary's `tokenizer.ggml.model`."""
    if vocab.model == "llama":
        return SentencePieceModel(vocab)
    if vocab.model == "gpt2":
        return ByteLevelBPEModel(vocab)
    raise ValueError(f"tokenizer.ggml.model = {vocab.model!r} is not supported (llama or gpt2)")


_HEAD_CHARS = 3
_SET_SCAN_MAX_CHARS = 4096  # longer texts are scanned once per distinct head instead


class Tokenizer:
    """encode / decode / token_bytes / is_special over one Vocab; the fragment encoder picked by vocab.model."""

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self.vocab_size = len(vocab.tokens)
        self.bos_token_id = vocab.bos_token_id
        self.eos_token_id = vocab.eos_token_id
        self.unk_token_id = vocab.unk_token_id
        self.pad_token_id = vocab.pad_token_id
        self.add_bos = vocab.add_bos
        self._model = fragment_encoder(vocab)
        self._user_defined = self._specials({TOKEN_USER_DEFINED})
        self._all_specials = self._specials({TOKEN_USER_DEFINED, TOKEN_CONTROL})
        # Piece -> its rank in longest-first order, by its first _HEAD_CHARS characters: a text is searched only
        # for the specials whose head occurs in it (vocabularies hold thousands of them).
        self._by_head = {False: self._index_by_head(self._user_defined), True: self._index_by_head(self._all_specials)}
        self._piece_bytes = [self._model.token_bytes(i) for i in range(self.vocab_size)]
        self._special_ids = frozenset(i for i, t in enumerate(vocab.types) if t == TOKEN_CONTROL)
        self._ids_by_piece: dict[str, int] | None = None

    def token_id(self, piece: str) -> int:
        """The id of a vocabulary piece (its text as stored, e.g. "<end_of_turn>"); KeyError when absent."""
        if self._ids_by_piece is None:
            self._ids_by_piece = {}
            for i, p in enumerate(self.vocab.tokens):
                self._ids_by_piece.setdefault(p, i)
        return self._ids_by_piece[piece]

    def _specials(self, kinds: set[int]) -> list[tuple[str, int, bool]]:
        """(piece, id, is_control), longest piece first."""
        found = [
            (p, i, t == TOKEN_CONTROL)
            for i, (p, t) in enumerate(zip(self.vocab.tokens, self.vocab.types))
            if t in kinds and p
        ]
        return sorted(found, key=lambda pi: (-len(pi[0]), pi[1]))

    @staticmethod
    def _index_by_head(specials: list[tuple[str, int, bool]]) -> dict[str, list[int]]:
        index: dict[str, list[int]] = {}
        for rank, (piece, _, _) in enumerate(specials):
            index.setdefault(piece[:_HEAD_CHARS], []).append(rank)
        return index

    def _specials_in(self, text: str, with_control: bool) -> list[tuple[str, int, bool]]:
        """The specials that occur in text, longest first (the order of _specials)."""
        specials = self._all_specials if with_control else self._user_defined
        by_head = self._by_head[with_control]
        heads = (
            {text[i : i + n] for n in range(1, _HEAD_CHARS + 1) for i in range(len(text) - n + 1)}
            if len(text) <= _SET_SCAN_MAX_CHARS
            else None
        )
        ranks = [
            r for head, rs in by_head.items() if (head in heads if heads is not None else head in text) for r in rs
        ]
        return [specials[r] for r in sorted(ranks) if specials[r][0] in text]

    def _partition(self, text: str, control_spans: list[tuple[int, int]]) -> list[str | int]:
        """Split text into plain fragments (str) and special ids (int), longest special first, leftmost match.
        User-defined pieces match anywhere; control pieces only inside one of control_spans ([start, end))."""
        fragments: list[tuple[int, int] | int] = [(0, len(text))]
        for piece, token_id, control in self._specials_in(text, bool(control_spans)):
            out: list[tuple[int, int] | int] = []
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                    continue
                lo, hi = frag
                pos = text.find(piece, lo, hi)
                while pos >= 0:
                    end = pos + len(piece)
                    if not control or any(a <= pos and end <= b for a, b in control_spans):
                        if pos > lo:
                            out.append((lo, pos))
                        out.append(token_id)
                        lo = end
                        pos = text.find(piece, lo, hi)
                    else:
                        pos = text.find(piece, pos + 1, hi)
                if hi > lo:
                    out.append((lo, hi))
            fragments = out
        return [f if isinstance(f, int) else text[f[0] : f[1]] for f in fragments]

    def _encode_text(self, text: str, control_spans: list[tuple[int, int]]) -> list[int]:
        ids: list[int] = []
        for frag in self._partition(text, control_spans):
            if isinstance(frag, int):
                ids.append(frag)
            elif frag:
                ids.extend(self._model.encode(frag))
        return ids

    def encode(self, text: str, add_bos: bool | None = None, parse_special: bool = True) -> list[int]:
        """Token ids of text; add_bos None: as the vocabulary says (`add_bos`)."""
        if add_bos is None:
            add_bos = self.add_bos
        ids = [self.bos_token_id] if add_bos else []
        return ids + self._encode_text(text, [(0, len(text))] if parse_special else [])

    def encode_pieces(self, pieces: Sequence[tuple[str, bool] | Sequence[int]]) -> list[int]:
        """Tokens of the concatenated pieces, no BOS: a text piece (text, parse_special) has control tokens
        parsed only if parse_special; a piece of ids is kept as it is. The text between id pieces is tokenized
        as one text (user-defined pieces and plain runs may span text pieces), so when the unparsed pieces
        hold no control token's text the result equals encode(all the text, parse_special=True)."""
        ids: list[int] = []
        run: list[str] = []
        spans: list[tuple[int, int]] = []
        size = 0

        def flush() -> None:
            nonlocal size
            if run:
                ids.extend(self._encode_text("".join(run), spans))
            run.clear()
            spans.clear()
            size = 0

        for piece in pieces:
            if isinstance(piece, tuple) and len(piece) == 2 and isinstance(piece[0], str):
                text, parse_special = piece
                if parse_special and text:
                    spans.append((size, size + len(text)))
                run.append(text)
                size += len(text)
            else:
                flush()
                ids.extend(int(i) for i in piece)
        flush()
        return ids

    def token_bytes(self, token_id: int) -> bytes:
        return self._piece_bytes[token_id]

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        data = b"".join(self._piece_bytes[i] for i in ids if not (skip_special and i in self._special_ids))
        return data.decode("utf-8", errors="replace")

    def max_token_bytes(self) -> int:
        """Bytes of the longest piece (bounds how much text a context of N tokens can hold)."""
        return max(len(b) for b in self._piece_bytes)


class IncrementalDetokenizer:
    """Streams text deltas for a growing id sequence; holds back incomplete UTF-8 sequences.

    Every delta is valid text: a multi-byte character split over several tokens (SentencePiece byte
    fallback, or byte-level BPE pieces that end inside a character) is emitted only once complete;
    bytes that can never form a character become U+FFFD.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True, spaces_between_special: bool = False) -> None:
        """skip_special: special tokens give no text; else, with spaces_between_special, a special token's text
        is separated by a space from the text before and after it (vLLM's spaces_between_special_tokens)."""
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._spaces = spaces_between_special and not skip_special
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._any_text = False
        self._after_special = False

    def feed(self, token_id: int) -> str:
        special = self._tokenizer.is_special(token_id)
        if self._skip_special and special:
            return ""
        text = self._decoder.decode(self._tokenizer.token_bytes(token_id))
        if self._spaces and text and (special and self._any_text or not special and self._after_special):
            text = " " + text
        if text:
            self._any_text, self._after_special = True, special
        return text

    def flush(self) -> str:
        """End of stream: any held-back partial character becomes U+FFFD."""
        return self._decoder.decode(b"", final=True)
