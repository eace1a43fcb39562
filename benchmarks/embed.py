"""Embedding throughput, all-MiniLM-L6-v2's shape: 10,000 texts of 16 to 256 tokens (uniform, seed 0), wick's
LLM.embed against sentence-transformers' `encode` (batch 128) on the same device in the same run, both in fp16 on
a GPU; inputs per second, tokens per second and the ratio, with the device and the versions.

Without --model both load the same random-weight sentence-transformers folder in MiniLM's shape (BertModel, 6 layers
of 384, mean pooling, Normalize) written to a temporary folder, with a WordPiece vocabulary of made-up words; with
--model FOLDER (a sentence-transformers folder, e.g. the real all-MiniLM-L6-v2) both load that."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import print_environment
from wick import LLM

_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def minilm_shaped_folder(folder: Path, seed: int = 0) -> None:
    """A sentence-transformers folder in all-MiniLM-L6-v2's shape with random weights and a made-up vocabulary."""
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    config = BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                        intermediate_size=1536, max_position_embeddings=512, hidden_act="gelu")
    torch.manual_seed(seed)
    BertModel(config, add_pooling_layer=False).save_pretrained(folder)
    words = _SPECIALS + [f"w{i}" for i in range(config.vocab_size - len(_SPECIALS))]
    backend = BertWordPieceTokenizer({word: i for i, word in enumerate(words)})
    PreTrainedTokenizerFast(tokenizer_object=backend._tokenizer, model_max_length=512, pad_token="[PAD]",
                            unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
                            mask_token="[MASK]").save_pretrained(folder)
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256, "do_lower_case": False}))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 384, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True}))


def workload(tokenizer, num_inputs: int, min_tokens: int, max_tokens: int, seed: int) -> list[str]:  # noqa: ANN001
    """Texts of whole vocabulary words that are one token each, so that a text of n - 2 words is n tokens."""
    words = [w for w in tokenizer.get_vocab() if w.isalpha() and w.isascii() and w.islower()] or \
        [w for w in tokenizer.get_vocab() if w.startswith("w") and w[1:].isdigit()]
    single = [w for w, ids in zip(words, tokenizer(words, add_special_tokens=False)["input_ids"], strict=True)
              if len(ids) == 1]
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_tokens, max_tokens + 1, num_inputs) - 2  # [CLS] and [SEP]
    return [" ".join(single[i] for i in rng.integers(0, len(single), n)) for n in lengths]


def timed(run, texts: list[str]) -> tuple[float, object]:  # noqa: ANN001
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = run(texts)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a sentence-transformers folder (default: a random MiniLM)")
    parser.add_argument("--num-inputs", type=int, default=10_000)
    parser.add_argument("--min-tokens", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--dtype", default=None, help="default: float16 on a GPU, float32 on a CPU")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch-size", type=int, default=128, help="sentence-transformers' batch size")
    parser.add_argument("--max-num-batched-tokens", type=int, default=32768, help="wick's tokens per step")
    parser.add_argument("--max-num-seqs", type=int, default=512, help="wick's sequences per step")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    dtype = args.dtype or ("float16" if args.device == "cuda" else "float32")
    print_environment()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.model
        if folder is None:
            folder = tmp
            minilm_shaped_folder(Path(folder), args.seed)
        from sentence_transformers import SentenceTransformer
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder)
        texts = workload(tokenizer, args.num_inputs, args.min_tokens, args.max_tokens, args.seed)
        num_tokens = sum(len(ids) for ids in tokenizer(texts)["input_ids"])
        print(f"model {args.model or 'random all-MiniLM-L6-v2 shape'}; {len(texts)} inputs, {num_tokens} tokens "
              f"({num_tokens / len(texts):.0f} per input); {dtype} on {args.device}")

        llm = LLM(folder, device=args.device, dtype=dtype, max_num_batched_tokens=args.max_num_batched_tokens,
                  max_num_seqs=args.max_num_seqs)
        llm.embed(texts[:256])  # warm-up
        wick_s, outputs = timed(llm.embed, texts)
        ours = np.array([o.outputs.embedding for o in outputs[:256]])
        del llm
        print(f"wick LLM.embed: {wick_s:.2f} s = {len(texts) / wick_s:,.0f} inputs/s, "
              f"{num_tokens / wick_s:,.0f} tokens/s")

        st = SentenceTransformer(folder, device=args.device)
        if dtype == "float16":
            st = st.half()
        st.encode(texts[:256], batch_size=args.batch_size)  # warm-up
        st_s, theirs = timed(lambda t: st.encode(t, batch_size=args.batch_size, convert_to_numpy=True), texts)
        print(f"sentence-transformers encode (batch {args.batch_size}): {st_s:.2f} s = {len(texts) / st_s:,.0f} "
              f"inputs/s, {num_tokens / st_s:,.0f} tokens/s")
        cosine = (ours * theirs[:256]).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs[:256], axis=1)
        print(f"wick / sentence-transformers: {st_s / wick_s:.2f}x (embeddings agree: min cosine {cosine.min():.5f} "
              "over the first 256)")


if __name__ == "__main__":
    main()
