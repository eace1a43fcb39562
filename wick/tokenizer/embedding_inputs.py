"""The token ids of embedding inputs: texts encoded with the model's special tokens (in one batch: the fast
tokenizer spreads it over threads), token ids as given, optionally truncated, checked against the model's
maximum length."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase


def tokenize_for_embedding(tokenizer: PreTrainedTokenizerBase | None, inputs: list[str | list[int]], max_len: int,
                           truncate_prompt_tokens: int | None = None) -> list[list[int]]:
    """`truncate_prompt_tokens` k keeps a text's first k tokens, its special tokens included (as sentence-transformers
    truncates at its max_seq_length), and a token-id input's last k (as vLLM does); -1 stands for `max_len`.
    ValueError for an empty input, or one longer than `max_len` that is not truncated."""
    limit = max_len if truncate_prompt_tokens == -1 else truncate_prompt_tokens
    if limit is not None and not 1 <= limit <= max_len:
        raise ValueError(f"truncate_prompt_tokens must be -1 or in [1, {max_len}] (the model's maximum length), "
                         f"got {truncate_prompt_tokens}")
    texts = [(i, text) for i, text in enumerate(inputs) if isinstance(text, str)]
    token_ids = [list(ids) if not isinstance(ids, str) else [] for ids in inputs]
    if texts:
        if tokenizer is None:
            raise ValueError("this model was loaded without a tokenizer: give token ids")
        truncation = {"truncation": True, "max_length": limit} if limit is not None else {}
        encoded = tokenizer([text for _, text in texts], add_special_tokens=True, **truncation)["input_ids"]
        for (i, _), ids in zip(texts, encoded, strict=True):
            token_ids[i] = ids
    for i, ids in enumerate(token_ids):
        if limit is not None and not isinstance(inputs[i], str):
            token_ids[i] = ids = ids[-limit:]
        if not ids:
            raise ValueError(f"input {i} is empty")
        if len(ids) > max_len:
            raise ValueError(f"input {i} has {len(ids)} tokens, more than this model's maximum of {max_len} "
                             "(truncate_prompt_tokens truncates it)")
    return token_ids
