"""Where one decode step's time goes on rank 0 at batch 1: sending the step to the other ranks (tensor
parallelism: the step channel), the model runner's host work up to the graph launch (execute), and the
sampling that waits for the GPU (sample). Wraps the calls with timers; prints means per step."""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable

import torch

from benchmarks.common import print_environment
from benchmarks.graph_gaps import GraphGaps
from benchmarks.kernel_timeline import print_timeline, step_timeline
from benchmarks.overrides import add_set_argument, apply_overrides
from wick import LLM, SamplingParams
from wick.executor.step_channel import StepChannel
from wick.worker.worker import Worker

_times: dict[str, list[float]] = defaultdict(list)


def _timed(fn: Callable, key: str) -> Callable:
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        _times[key].append(time.perf_counter() - start)
        return result

    return wrapper


def _log_triton_compiles() -> None:
    """Prints every Triton kernel compiled from now on, with its time (a step that compiles stalls)."""
    from triton.runtime.jit import JITFunction

    compile_fn = getattr(JITFunction, "_do_compile", None)
    if compile_fn is None:
        print("this Triton has no JITFunction._do_compile: compiles are not logged")
        return

    def logged(self, *args, **kwargs):
        start = time.perf_counter()
        kernel = compile_fn(self, *args, **kwargs)
        print(f"  compiled {self.__name__} in {(time.perf_counter() - start) * 1e3:,.0f} ms")
        return kernel

    JITFunction._do_compile = logged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--attention-backend", default=None)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--quantization", "-q", default=None, help="weights quantized at load, e.g. q4_k, gptq, fp8")
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy; above it, seeded random sampling")
    parser.add_argument("--profile-steps", type=int, default=0,
                        help="then run this many steps under the torch profiler and print where the time goes: the "
                             "profiler's table and what each kernel adds to a decode step (kernel_timeline.py)")
    parser.add_argument("--profile-sort", default="self_cpu_time_total",
                        help="the profiler table's order: self_cpu_time_total (the host) or self_cuda_time_total")
    parser.add_argument("--trace", default=None,
                        help="with --profile-steps: also write the profiler's Chrome trace (GPU timestamps) here")
    parser.add_argument("--graph-gaps", action="store_true",
                        help="time the GPU between decode graph replays with CUDA events (no profiler)")
    parser.add_argument("--cprofile-steps", type=int, default=0,
                        help="then run this many steps under cProfile and print the host functions by own time")
    add_set_argument(parser)
    args = parser.parse_args()
    apply_overrides(args.overrides, args.tensor_parallel_size)
    print_environment()
    StepChannel.send = _timed(StepChannel.send, "sending the step to the other ranks")
    Worker.execute_and_sample = _timed(Worker.execute_and_sample, "whole step on rank 0")
    llm = LLM(args.model, load_format="dummy", max_model_len=1024, max_num_seqs=max(16, args.batch_size),
              attention_backend=args.attention_backend, enforce_eager=args.enforce_eager,
              tensor_parallel_size=args.tensor_parallel_size, async_scheduling=args.async_scheduling,
              quantization=args.quantization)
    core, runner = llm.core, llm.core.executor.worker.runner
    core.step = _timed(core.step, "whole engine step")
    core.scheduler.schedule = _timed(core.scheduler.schedule, "schedule")
    core.scheduler.update_from_output = _timed(core.scheduler.update_from_output, "update from output")
    llm.output_processor.process_outputs = _timed(llm.output_processor.process_outputs, "detokenize")
    runner.execute_model = _timed(runner.execute_model, "execute (host work, forward launched)")
    runner.launch_sampling = _timed(runner.launch_sampling, "launch sampling")
    runner.take_output = _timed(runner.take_output, "take output (waits for the GPU)")
    prompts = [list(range(1000 + i, 1128 + i)) for i in range(args.batch_size)]
    llm.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True))
    _times.clear()
    gaps = GraphGaps() if args.graph_gaps else None
    if gaps is not None:
        gaps.install(runner)
    sampling = dict(ignore_eos=True, temperature=args.temperature, seed=0)
    _log_triton_compiles()
    torch.cuda.synchronize()
    start = time.perf_counter()
    llm.generate(prompts, SamplingParams(max_tokens=args.output_len, **sampling))
    elapsed = time.perf_counter() - start
    print(f"TP={args.tensor_parallel_size}, batch {args.batch_size}, overlap {core.config.async_scheduling}: "
          f"{args.batch_size * args.output_len / elapsed:,.0f} tokens/s, "
          f"{elapsed / args.output_len * 1e3:.2f} ms per step")
    for key, values in _times.items():
        ordered = sorted(values)
        median = ordered[len(values) // 2]
        print(f"  {key}: {sum(values) / len(values) * 1e6:,.0f} us per step (median {median * 1e6:,.0f}, "
              f"max {ordered[-1] * 1e6:,.0f}; {len(values)} calls)")
    if gaps is not None:
        gaps.report()
    if args.cprofile_steps:
        params = SamplingParams(max_tokens=args.cprofile_steps, **sampling)
        profile = cProfile.Profile()
        profile.runcall(llm.generate, prompts, params)
        print(f"cProfile, {args.cprofile_steps} steps (times in total):")
        pstats.Stats(profile).sort_stats("tottime").print_stats(40)
    if args.profile_steps:
        params = SamplingParams(max_tokens=args.profile_steps, **sampling)
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as profile:
            llm.generate(prompts, params)
        print(f"torch profiler, {args.profile_steps} steps (times in total):")
        print(profile.key_averages().table(sort_by=args.profile_sort, row_limit=30, max_name_column_width=60))
        with tempfile.TemporaryDirectory() as scratch:
            trace = args.trace or os.path.join(scratch, "trace.json")
            profile.export_chrome_trace(trace)
            with open(trace) as f:
                print_timeline(step_timeline(json.load(f)["traceEvents"]), llm.config.hf_config.num_hidden_layers)


if __name__ == "__main__":
    main()
