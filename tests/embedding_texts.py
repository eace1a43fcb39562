"""A batch of 32 texts of mixed lengths (1 to about 230 tokens for a BERT WordPiece tokenizer), for embedding tests."""

from __future__ import annotations

_SENTENCES = [
    "The cat sits on the mat.",
    "A paged KV cache keeps the keys and values of every running sequence in fixed-size blocks.",
    "Embeddings map text to vectors whose cosine similarity tracks meaning.",
    "Continuous batching admits new requests while others are still decoding.",
    "Paris is the capital of France, and Berlin is the capital of Germany.",
    "Sentence-transformers pools the token embeddings of a BERT encoder into one vector.",
    "Die Katze schläft auf dem Sofa, während draußen der Regen fällt.",
    "数値計算のためのライブラリ",
]


def mixed_texts() -> list[str]:
    texts = []
    for i in range(32):
        words = " ".join(_SENTENCES[(i + j) % len(_SENTENCES)] for j in range(1 + (i * 7) % 15))
        texts.append(words if i % 5 else words.split(".")[0][: 1 + i])
    return texts
