"""Structured output on the GPU: the throughput workload of benchmarks/throughput.py with every request held to a
JSON schema, and with every other one held (a mixed batch), each against a free run of the same schedule, in one
process on the same prompts.

The masks for step N+1 are filled on the CPU while the GPU runs step N, so a constrained step should cost about
what a free one does. Random weights sample random tokens inside the grammar, so a constrained output is valid JSON
that may end early (when its grammar does); the free run it is compared with gives each request the length its
constrained output had, so both runs make the same tokens in the same steps. Every output that ended by its grammar
is parsed and validated against the schema. A full free run first warms up (Triton's autotuning included).

    python -m benchmarks.structured_throughput --tokenizer FOLDER   (the model's tokenizer; the weights are dummy)
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from benchmarks.common import print_environment
from benchmarks.structured_output import SCHEMA
from benchmarks.throughput import add_workload_args, workload
from wick import LLM, SamplingParams
from wick.outputs import RequestOutput
from wick.sampling_params import StructuredOutputsParams

MODES = {"json": lambda i: True, "mixed": lambda i: i % 2 == 0}


def run(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]) -> tuple[list[RequestOutput], float]:
    sync = torch.cuda.synchronize if torch.cuda.is_available() else lambda: None
    sync()
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    sync()
    return outputs, time.perf_counter() - start


def check_documents(outputs: list[RequestOutput], constrained: list[bool]) -> tuple[int, int]:
    """(outputs the grammar ended, of them those that parse and validate against SCHEMA)."""
    import jsonschema

    ended = valid = 0
    for output, held in zip(outputs, constrained, strict=True):
        sample = output.outputs[0]
        if held and sample.finish_reason == "stop":
            ended += 1
            try:
                jsonschema.validate(json.loads(sample.text), SCHEMA)
                valid += 1
            except (ValueError, jsonschema.ValidationError):
                pass
    return ended, valid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_workload_args(parser)
    parser.add_argument("--tokenizer", required=True)
    args = parser.parse_args()
    print_environment()

    llm = LLM(args.model, load_format="dummy", tokenizer=args.tokenizer, max_num_seqs=args.max_num_seqs,
              max_model_len=args.max_model_len, attention_backend=args.attention_backend, seed=args.seed)
    prompts, output_lens = workload(args.num_requests, args.min_len, args.max_len, llm.config.hf_config.vocab_size,
                                    args.seed)
    schema = StructuredOutputsParams(json=SCHEMA)
    # Warm-up, the grammar compile included (compiled grammars are cached by their spec).
    warmup = prompts[:8]
    llm.generate(warmup, [SamplingParams(max_tokens=16, structured_outputs=schema)] * len(warmup))

    def params(lengths: list[int], constrained: list[bool]) -> list[SamplingParams]:
        return [SamplingParams(temperature=args.temperature, max_tokens=n, ignore_eos=True, seed=i,
                               structured_outputs=schema if c else None)
                for i, (n, c) in enumerate(zip(lengths, constrained, strict=True))]

    free = [False] * len(prompts)
    outputs, elapsed = run(llm, prompts, params(output_lens, free))
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    print(f"warm-up, free: {generated} output tokens in {elapsed:.2f} s = {generated / elapsed:,.0f} output tokens/s")
    for mode, held in MODES.items():
        constrained = [held(i) for i in range(len(prompts))]
        outputs, elapsed = run(llm, prompts, params(output_lens, constrained))
        lengths = [len(o.outputs[0].token_ids) for o in outputs]
        ended, valid = check_documents(outputs, constrained)
        _, free_elapsed = run(llm, prompts, params(lengths, free))
        generated = sum(lengths)
        print(f"{mode}: {sum(constrained)} of {len(prompts)} requests held to the schema, {ended} ended by their "
              f"grammar, {valid} of them valid; {generated} output tokens: {generated / elapsed:,.0f} output "
              f"tokens/s; free, same lengths: {generated / free_elapsed:,.0f}; ratio {free_elapsed / elapsed:.2f}")

if __name__ == "__main__":
    main()
