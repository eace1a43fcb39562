"""Incremental detokenization: the text of a request's output, a delta per step, in O(new tokens)."""

from __future__ import annotations

from collections.abc import Callable

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerBase

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Turns output token ids, as they come, into text deltas whose concatenation is exactly
    `tokenizer.decode(output_ids, skip_special_tokens=..., spaces_between_special_tokens=...)`,
    provided `flush()` is called when the request ends.

    Each step decodes only a short window of ids: those from `prefix_offset`, the start of the text
    emitted last time, to the end. The new text is what the window decodes to beyond what its first
    part (up to `read_offset`, everything emitted so far) decodes to. Decoding the already-emitted part
    again gives the next token its context: SentencePiece drops the space ("▁") of the first token a
    decode sees, and byte-level BPE needs the bytes of a character split over several tokens.

    Text is held back while later tokens could still change it:
    - while the window ends in U+FFFD: a character's bytes are still incomplete;
    - with SentencePiece byte fallback, while the output ends in byte pieces ("<0xE6>"): the decoder
      turns a whole run of byte pieces into U+FFFDs, valid bytes included, if the run is not valid UTF-8.

    The text depends on the output ids only, as `decode(output_ids)` does. `prompt_token_ids` is
    taken but not decoded as context: with it, a SentencePiece reply would start with the space of its
    first "▁" token, which `decode(output_ids)` drops.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, prompt_token_ids: list[int],
                 skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.spaces_between_special_tokens = spaces_between_special_tokens
        self.output_token_ids: list[int] = []
        self.output_text = ""
        self.prefix_offset = 0
        self.read_offset = 0
        self._byte_fallback = _has_byte_fallback(tokenizer)
        # Skipped special tokens vanish before decoding, so byte pieces on both sides form one run.
        self._vanishing_ids: frozenset[int] = frozenset()
        if self._byte_fallback and skip_special_tokens:
            self._vanishing_ids = frozenset(i for i, t in tokenizer.added_tokens_decoder.items() if t.special)
        # Where the trailing run of byte pieces (and vanishing tokens) starts: the end of settled text.
        self._settled_end = 0
        self._backend_decode = _backend_decode(tokenizer)

    def add_tokens(self, token_ids: list[int]) -> str:
        """Take the next output token ids; return the text they complete (maybe empty)."""
        if not token_ids:
            return ""
        start = len(self.output_token_ids)
        self.output_token_ids.extend(token_ids)
        if not self._byte_fallback:
            return self._emit(len(self.output_token_ids), final=False)
        for offset, token_id in enumerate(token_ids, start):
            if token_id not in self._vanishing_ids and not self._is_byte_piece(token_id):
                self._settled_end = offset + 1
        return self._emit(self._settled_end, final=False)

    def flush(self) -> str:
        """At the end of the request: the text still held back, so that `output_text` is the full decode."""
        return self._emit(len(self.output_token_ids), final=True)

    def _emit(self, end: int, final: bool) -> str:
        if end <= self.read_offset:
            return ""
        ids = self.output_token_ids
        emitted = self._decode(ids[self.prefix_offset:self.read_offset])
        text = self._decode(ids[self.prefix_offset:end])
        if not final and (len(text) <= len(emitted) or text.endswith(_REPLACEMENT)):
            return ""
        delta = text[len(emitted):]
        self.prefix_offset, self.read_offset = self.read_offset, end
        self.output_text += delta
        return delta

    def _decode(self, token_ids: list[int]) -> str:
        if not token_ids:
            return ""
        if self._backend_decode is not None:
            return self._backend_decode(token_ids, skip_special_tokens=self.skip_special_tokens)
        return self.tokenizer.decode(token_ids, skip_special_tokens=self.skip_special_tokens,
                                     spaces_between_special_tokens=self.spaces_between_special_tokens)

    def _is_byte_piece(self, token_id: int) -> bool:
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        return isinstance(piece, str) and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">")


def _backend_decode(tokenizer: PreTrainedTokenizerBase) -> Callable[..., str] | None:
    """The Rust tokenizer's own decode where `tokenizer.decode` adds nothing to it (a fast tokenizer that does
    not clean up spaces): the same text without the Python layers around it, which cost several times more."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if not isinstance(backend, Tokenizer) or getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return None
    return backend.decode


def _has_byte_fallback(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the tokenizer decodes SentencePiece byte pieces ("<0x41>") into bytes."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return hasattr(tokenizer, "sp_model")
    return "ByteFallback" in repr(backend.decoder)
