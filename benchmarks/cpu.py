"""CPU prefill and decode speed of wick against llama.cpp (llama-cpp-python) on the same GGUF file, in one run.

For each prompt length: the time to prefill a prompt of random token ids (seed 0; the prefix cache off, so every
run computes the whole prompt) up to its first token, and greedy decode tokens per second over the
`--decode-tokens` tokens after it (EOS ignored), both timed within one request. Both engines use the same
number of threads (torch's) and are timed back to back in each of `--repeats` rounds; prints each figure's
median and the median of the rounds' wick / llama.cpp ratios.

    pip install llama-cpp-python
    python -m benchmarks.cpu                                   # the default model (SmolLM2-135M-Instruct Q4_1)
    python -m benchmarks.cpu --model /path/model.gguf --prompt-lens 256 1024 2048 --decode-tokens 128 --repeats 5
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass
from statistics import median

import torch

# Issue 16's targets: wick's decode >= 0.5x llama.cpp's, its prefill at 2k tokens >= 0.3x.
DECODE_TARGET, PREFILL_TARGET = 0.5, 0.3


@dataclass
class Figures:
    prefill_s: float
    decode_tokens_per_s: float


def prompt_ids(length: int, vocab_size: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, vocab_size - 100) for _ in range(length)]


class Wick:
    def __init__(self, model: str | None, max_model_len: int, decode_tokens: int) -> None:
        from wick import LLM, SamplingParams

        self.llm = LLM(model, max_model_len=max_model_len, enable_prefix_caching=False, device="cpu")
        self.params = SamplingParams(max_tokens=decode_tokens + 1, temperature=0.0, ignore_eos=True)
        self.decode_tokens = decode_tokens
        self.requests = 0
        self.llm.generate({"prompt_token_ids": list(range(100, 132))}, self.params)  # warm-up

    def measure(self, ids: list[int]) -> Figures:
        """One request through the engine core, as llama.cpp's is timed: the steps up to its first token
        (prefill), then the steps of the next decode_tokens tokens."""
        from wick.engine.protocol import EngineCoreRequest

        core = self.llm.core
        self.requests += 1
        core.add_request(EngineCoreRequest(f"bench-{self.requests}", ids, self.params))
        start = time.perf_counter()
        while not any(o.new_token_ids for o in core.step()):
            pass
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        while core.has_unfinished_requests():
            core.step()
        return Figures(prefill, self.decode_tokens / (time.perf_counter() - start))


class LlamaCpp:
    def __init__(self, path: str, max_model_len: int, decode_tokens: int, max_prompt: int) -> None:
        from llama_cpp import Llama

        self.llm = Llama(model_path=path, n_ctx=max_model_len, n_batch=max_prompt,
                         n_threads=torch.get_num_threads(), verbose=False)
        self.decode_tokens = decode_tokens
        self.llm.eval(list(range(100, 132)))  # warm-up

    def _next_token(self) -> int:
        import numpy as np

        # Only the last position has logits (llama-cpp-python keeps no copy of them without logits_all).
        logits = np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.llm.n_vocab(),))
        return int(np.argmax(logits))

    def measure(self, ids: list[int]) -> Figures:
        self.llm.reset()
        start = time.perf_counter()
        self.llm.eval(ids)
        prefill = time.perf_counter() - start
        token = self._next_token()
        start = time.perf_counter()
        for _ in range(self.decode_tokens):
            self.llm.eval([token])
            token = self._next_token()
        return Figures(prefill, self.decode_tokens / (time.perf_counter() - start))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a .gguf file (default: the default model's)")
    parser.add_argument("--prompt-lens", type=int, nargs="+", default=[256, 1024, 2048])
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3,
                        help="rounds, each timing both engines back to back (in turn first): medians are printed")
    parser.add_argument("--skip-llama-cpp", action="store_true")
    args = parser.parse_args()

    from wick.loader.model_source import default_model_path, resolve_model

    path = args.model or default_model_path()
    vocab_size = resolve_model(path).config.vocab_size
    prompts = [prompt_ids(n, vocab_size) for n in args.prompt_lens]
    max_model_len = max(args.prompt_lens) + args.decode_tokens + 16
    print(f"model {path}; {torch.get_num_threads()} threads; torch {torch.__version__}", flush=True)
    engines = [Wick(path, max_model_len, args.decode_tokens)]
    if not args.skip_llama_cpp:
        engines.append(LlamaCpp(path, max_model_len, args.decode_tokens, max(args.prompt_lens)))
    # figures[prompt][engine]: one Figures per round. The machine's speed drifts (shared cores), so the two
    # engines are timed back to back in every round and their ratios are taken round by round.
    figures = [[[] for _ in engines] for _ in prompts]
    for round_ in range(args.repeats):
        for p, ids in enumerate(prompts):
            order = range(len(engines)) if round_ % 2 == 0 else reversed(range(len(engines)))
            for e in order:
                figures[p][e].append(engines[e].measure(ids))
    print("| prompt tokens | wick prefill s | llama.cpp prefill s | ratio | wick decode tok/s | "
          "llama.cpp decode tok/s | ratio |")
    print("|---|---|---|---|---|---|---|")
    for n, per_engine in zip(args.prompt_lens, figures, strict=True):
        ours = per_engine[0]
        prefill, decode = median(f.prefill_s for f in ours), median(f.decode_tokens_per_s for f in ours)
        if len(per_engine) == 1:
            print(f"| {n} | {prefill:.3f} | - | - | {decode:.1f} | - | - |")
            continue
        theirs = per_engine[1]
        prefill_ratio = median(t.prefill_s / o.prefill_s for o, t in zip(ours, theirs, strict=True))
        decode_ratio = median(o.decode_tokens_per_s / t.decode_tokens_per_s for o, t in zip(ours, theirs, strict=True))
        print(f"| {n} | {prefill:.3f} | {median(t.prefill_s for t in theirs):.3f} | {prefill_ratio:.2f}x | "
              f"{decode:.1f} | {median(t.decode_tokens_per_s for t in theirs):.1f} | {decode_ratio:.2f}x |")
    if len(engines) > 1:
        print(f"targets: decode >= {DECODE_TARGET}x llama.cpp's, prefill at 2k tokens >= {PREFILL_TARGET}x "
              f"(ratio = wick speed / llama.cpp speed, the median of {args.repeats} back-to-back rounds)")


if __name__ == "__main__":
    main()
