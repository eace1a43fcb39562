"""The engine flags every verb shares, with vLLM's names, turned into EngineArgs."""

from __future__ import annotations

import argparse

from wick.config import EngineArgs


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    # --w (weights folder) and --f (weights file) are candle-vllm's names.
    parser.add_argument("--model", "--m", "--w", "--f", default=None,
                        help="safetensors folder, HF model id, .gguf file or (with --load-format dummy) a preset; "
                             "default: SmolLM2-135M-Instruct")
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--load-format", default="auto", choices=["auto", "safetensors", "gguf", "dummy"])
    parser.add_argument("--dtype", "--d", default="auto")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--kv-cache-memory", type=int, default=None, help="bytes for the KV cache")
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--attention-backend", default=None)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chat-template", default=None)
    _add_quantization_flags(parser)


def _add_quantization_flags(parser: argparse.ArgumentParser) -> None:
    # vLLM's --quantization/-q; --isq is candle-vllm's name (q4k spellings accepted).
    parser.add_argument("--quantization", "-q", "--isq", default=None, metavar="METHOD",
                        help="weights' format: read from the checkpoint when unset (GGUF, GPTQ, AWQ, FP8); "
                             "q4_0 q4_1 q5_0 q5_1 q8_0 q2_k q3_k q4_k q5_k q6_k or fp8 quantize a full-precision "
                             "checkpoint while it loads")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8", "fp8_e4m3"],
                        help="fp8: e4m3 KV pages, twice the tokens in the same memory")
    parser.add_argument("--fp8-kvcache", dest="kv_cache_dtype", action="store_const", const="fp8",
                        help="candle-vllm's name for --kv-cache-dtype fp8")


def engine_args_from(args: argparse.Namespace) -> EngineArgs:
    return EngineArgs(
        model=args.model, tokenizer=args.tokenizer, load_format=args.load_format, dtype=args.dtype,
        device=args.device, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, block_size=args.block_size,
        gpu_memory_utilization=args.gpu_memory_utilization, kv_cache_memory=args.kv_cache_memory,
        enable_prefix_caching=args.enable_prefix_caching, enable_chunked_prefill=args.enable_chunked_prefill,
        attention_backend=args.attention_backend, enforce_eager=args.enforce_eager,
        tensor_parallel_size=args.tensor_parallel_size, seed=args.seed, chat_template=args.chat_template,
        quantization=args.quantization, kv_cache_dtype=args.kv_cache_dtype)
