"""The engine flags every verb shares, with vLLM's names (and candle-vllm's / vllm.rs's as aliases), grouped as
vLLM groups them, turned into EngineArgs."""

from __future__ import annotations

import argparse
import os
from typing import Any

from wick.config import TASKS, EngineArgs

MIB = 1 << 20


def add_engine_flags(parser: argparse.ArgumentParser, positional_model: bool = False) -> None:
    """`positional_model`: also take the model as the first argument (`wick serve MODEL`, as `vllm serve`)."""
    model = parser.add_argument_group("model")
    if positional_model:
        model.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                           help="the model, as --model names it")
    model.add_argument("--model", "--m", "--w", default=None,
                       help="safetensors folder, HF model id, .gguf file or (with --load-format dummy) a preset; "
                            "default: SmolLM2-135M-Instruct. --m (HF id) and --w (folder) are candle-vllm's names")
    model.add_argument("--f", dest="gguf_file", default=None, metavar="FILE",
                       help="a .gguf file (candle-vllm / vllm.rs); with --m, a file of that HF repo")
    model.add_argument("--task", default="auto", choices=TASKS,
                       help="embed: serve embeddings (/v1/embeddings) from the pooled hidden states; auto (default): "
                            "embed for a sentence-transformers folder or an encoder such as BertModel, else generate")
    model.add_argument("--tokenizer", default=None)
    model.add_argument("--load-format", default="auto", choices=["auto", "safetensors", "gguf", "dummy"])
    model.add_argument("--dtype", default="auto")
    model.add_argument("--max-model-len", type=int, default=None)
    model.add_argument("--chat-template", default=None)
    model.add_argument("--trust-remote-code", action="store_true",
                       help="let a hub tokenizer run its repo's code (vLLM's flag); model code is always wick's")
    model.add_argument("--download-dir", default=None, metavar="DIR",
                       help="where to keep weights downloaded from the HF hub (default: the HF cache)")
    model.add_argument("--yarn-scaling-factor", type=float, default=None, metavar="FACTOR",
                       help="stretch the context FACTOR times with YaRN rope scaling (vllm.rs)")
    model.add_argument("--generation-config", default="auto",
                       help="sampling defaults: 'auto' (the model's generation_config.json), 'vllm' (none), "
                            "or a folder holding a generation_config.json")

    cache = parser.add_argument_group("cache")
    cache.add_argument("--block-size", type=int, default=16)
    cache.add_argument("--gpu-memory-utilization", "--gpu-memory-fraction", type=float, default=0.9)
    cache.add_argument("--kv-cache-memory", type=int, default=None, help="bytes for the KV cache")
    cache.add_argument("--mem", type=int, default=None, metavar="MIB",
                       help="MiB for the KV cache (candle-vllm / vllm.rs); --kv-cache-memory in MiB")
    cache.add_argument("--enable-prefix-caching", "--prefix-cache", action=argparse.BooleanOptionalAction,
                       default=True)

    scheduler = parser.add_argument_group("scheduler")
    scheduler.add_argument("--max-num-seqs", type=int, default=256)
    scheduler.add_argument("--max-num-batched-tokens", "--prefill-chunk-size", type=int, default=None)
    scheduler.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True)

    device = parser.add_argument_group("device")
    device.add_argument("--device", default="auto")
    device.add_argument("--attention-backend", default=None)
    device.add_argument("--enforce-eager", action="store_true")
    device.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                        help="schedule the next step while the device runs this one (default: on a GPU)")
    device.add_argument("--seed", type=int, default=0)
    device.add_argument("--log", action="store_true", help="log wick's debug messages too (candle-vllm)")

    sampling = parser.add_argument_group(
        "sampling defaults", "for requests that leave them out (over the model's generation config)")
    sampling.add_argument("--temperature", type=float, default=None)
    sampling.add_argument("--top-p", type=float, default=None)
    sampling.add_argument("--top-k", type=int, default=None)
    sampling.add_argument("--min-p", type=float, default=None)
    sampling.add_argument("--repetition-penalty", type=float, default=None)
    sampling.add_argument("--frequency-penalty", type=float, default=None)
    sampling.add_argument("--presence-penalty", type=float, default=None)
    sampling.add_argument("--max-gen-tokens", "--max-tokens", dest="max_tokens", type=int, default=None,
                          help="max_tokens of a request that names none (default: a fifth of the context)")

    parallel = parser.add_argument_group("parallelism")
    parallel.add_argument("--tensor-parallel-size", "-tp", type=int, default=None,
                          help="ranks the model is split over (default 1, or the number of --d devices)")
    parallel.add_argument("--d", "--device-ids", dest="device_ids", default=None, metavar="IDS",
                          help="GPUs to run on, e.g. 0,1 (sets CUDA_VISIBLE_DEVICES; one rank per device)")
    parallel.add_argument("--nnodes", type=int, default=1, help="machines the ranks are spread over")
    parallel.add_argument("--node-rank", type=int, default=0,
                          help="this machine's place; 0 serves the API, the others run workers only")
    parallel.add_argument("--master-addr", default=None, help="node 0's address (default 127.0.0.1)")
    parallel.add_argument("--master-port", type=int, default=None,
                          help="node 0's port for torch.distributed (needed with several nodes)")

    quantization = parser.add_argument_group("quantization")
    # vLLM's --quantization/-q; --isq is candle-vllm's name (q4k spellings accepted).
    quantization.add_argument("--quantization", "-q", "--isq", default=None, metavar="METHOD",
                              help="weights' format: read from the checkpoint when unset (GGUF, GPTQ, AWQ, FP8); "
                                   "q4_0 q4_1 q5_0 q5_1 q8_0 q2_k q3_k q4_k q5_k q6_k or fp8 quantize a "
                                   "full-precision checkpoint while it loads")
    quantization.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8", "fp8_e4m3"],
                              help="fp8: e4m3 KV pages, twice the tokens in the same memory")
    quantization.add_argument("--fp8-kvcache", dest="kv_cache_dtype", action="store_const", const="fp8",
                              help="candle-vllm's name for --kv-cache-dtype fp8")


def engine_args_from(args: argparse.Namespace) -> EngineArgs:
    kv_cache_memory = args.kv_cache_memory
    if args.mem is not None:
        if kv_cache_memory is not None:
            raise ValueError("give --mem (MiB) or --kv-cache-memory (bytes), not both")
        kv_cache_memory = args.mem * MIB
    return EngineArgs(
        model=model_from(args), tokenizer=args.tokenizer, load_format=args.load_format, dtype=args.dtype,
        device=args.device, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, block_size=args.block_size,
        gpu_memory_utilization=args.gpu_memory_utilization, kv_cache_memory=kv_cache_memory,
        enable_prefix_caching=args.enable_prefix_caching, enable_chunked_prefill=args.enable_chunked_prefill,
        attention_backend=args.attention_backend, enforce_eager=args.enforce_eager,
        async_scheduling=args.async_scheduling, tensor_parallel_size=_tensor_parallel_size(args),
        nnodes=args.nnodes, node_rank=args.node_rank,
        master_addr=args.master_addr, master_port=args.master_port, seed=args.seed, chat_template=args.chat_template,
        trust_remote_code=args.trust_remote_code, download_dir=args.download_dir,
        generation_config=args.generation_config, override_generation_config=sampling_overrides(args),
        yarn_scaling_factor=args.yarn_scaling_factor, quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype, task=args.task)


def model_from(args: argparse.Namespace) -> str | None:
    """The model the flags name: --model (or the positional MODEL), --f alone, or --m REPO --f FILE (a GGUF
    file of a hub repo, as `REPO/FILE`)."""
    tag = getattr(args, "model_tag", None)
    if tag is not None and args.model is not None and tag != args.model:
        raise ValueError(f"two models named: {tag} and --model {args.model}")
    model = tag or args.model
    if args.gguf_file is None:
        return model
    if model is None:
        return args.gguf_file
    if not args.gguf_file.endswith(".gguf"):
        raise ValueError(f"--f names a .gguf file, got {args.gguf_file!r}")
    return f"{model.rstrip('/')}/{args.gguf_file}"


def sampling_overrides(args: argparse.Namespace) -> dict[str, Any]:
    names = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "frequency_penalty",
             "presence_penalty", "max_tokens")
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def _tensor_parallel_size(args: argparse.Namespace) -> int:
    """--d 0,1 names the GPUs (candle-vllm's flag): they become the visible devices, one rank each."""
    if args.device_ids is None:
        return args.tensor_parallel_size or 1
    ids = [i.strip() for i in args.device_ids.split(",") if i.strip()]
    if not ids or not all(i.isdigit() for i in ids):
        raise ValueError(f"--d takes device ids such as 0,1; got {args.device_ids!r}")
    if args.tensor_parallel_size not in (None, len(ids) * args.nnodes):
        raise ValueError(f"--d names {len(ids)} devices per node but --tensor-parallel-size is "
                         f"{args.tensor_parallel_size}")
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(ids)
    return len(ids) * args.nnodes
