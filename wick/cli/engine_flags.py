"""The engine flags every verb shares, with vLLM's names, turned into EngineArgs."""

from __future__ import annotations

import argparse
import os

from wick.config import EngineArgs


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    # --w (weights folder) and --f (weights file) are candle-vllm's names.
    parser.add_argument("--model", "--m", "--w", "--f", default=None,
                        help="safetensors folder, HF model id, .gguf file or (with --load-format dummy) a preset; "
                             "default: SmolLM2-135M-Instruct")
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--load-format", default="auto", choices=["auto", "safetensors", "gguf", "dummy"])
    parser.add_argument("--dtype", default="auto")
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
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chat-template", default=None)


def engine_args_from(args: argparse.Namespace) -> EngineArgs:
    return EngineArgs(
        model=args.model, tokenizer=args.tokenizer, load_format=args.load_format, dtype=args.dtype,
        device=args.device, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, block_size=args.block_size,
        gpu_memory_utilization=args.gpu_memory_utilization, kv_cache_memory=args.kv_cache_memory,
        enable_prefix_caching=args.enable_prefix_caching, enable_chunked_prefill=args.enable_chunked_prefill,
        attention_backend=args.attention_backend, enforce_eager=args.enforce_eager,
        tensor_parallel_size=_tensor_parallel_size(args), nnodes=args.nnodes, node_rank=args.node_rank,
        master_addr=args.master_addr, master_port=args.master_port, seed=args.seed,
        chat_template=args.chat_template)


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
