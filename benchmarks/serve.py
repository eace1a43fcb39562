"""Serving: concurrent streaming clients against a real `wick serve` process, on the throughput benchmark's
workload (benchmarks/throughput.py: the same prompts as token ids, the same output lengths with EOS ignored, the
same sampling, request i seeded with i). Reports request throughput, output and total tokens/s, TTFT, TPOT, ITL
and end-to-end latency (mean, median, p99) as `vllm bench serve` defines them (benchmarks/serve_metrics.py),
and, in the same run, the offline figure: benchmarks/throughput.py in a process of its own with the same engine
settings (before the server starts, so that the two never share the GPU), and the ratio serve / offline.

    python -m benchmarks.serve --tokenizer build/qwen-tokenizer            # 256 requests at once, Qwen3-0.6B shape
    python -m benchmarks.serve --tokenizer build/qwen-tokenizer --max-concurrency 64 --request-rate 20
    python -m benchmarks.serve --base-url http://127.0.0.1:8000 --no-offline   # a server already running

A dummy preset has no tokenizer of its own and the server needs one (to detokenize): --tokenizer names a folder
whose vocabulary covers the preset's (for Qwen3, Qwen2.5-Coder's, saved from its GGUF). With --base-url, the
model flags must be the server's (they make the prompts), and the offline run needs the GPU the server holds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import environment
from benchmarks.serve_client import Load, run_load
from benchmarks.serve_metrics import RequestResult, ServeMetrics
from benchmarks.server_process import WickServer, cpu_seconds_since, thread_cpu_ns
from benchmarks.throughput import add_workload_args, workload
from wick.loader.model_source import resolve_model

ROOT = Path(__file__).resolve().parents[1]
WARMUP_REQUESTS = 8
WARMUP_TOKENS = 16
_PROCESS_NAMES = {"api": "API server", "core": "engine core"}


def engine_flags(args: argparse.Namespace) -> list[str]:
    """The flags `wick serve` and benchmarks/throughput.py share, so that both run the same engine."""
    flags = ["--model", args.model, "--load-format", args.load_format, "--max-num-seqs", str(args.max_num_seqs),
             "--max-model-len", str(args.max_model_len), "--seed", str(args.seed),
             "--tensor-parallel-size", str(args.tensor_parallel_size)]
    if args.attention_backend is not None:
        flags += ["--attention-backend", args.attention_backend]
    if args.max_num_batched_tokens is not None:
        flags += ["--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    if args.enforce_eager:
        flags.append("--enforce-eager")
    return flags


def offline_throughput(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    """benchmarks/throughput.py on the same workload and engine settings, in a process of its own."""
    path = log_dir / "offline.json"
    command = [sys.executable, "-m", "benchmarks.throughput", *engine_flags(args),
               "--num-requests", str(args.num_requests), "--min-len", str(args.min_len), "--max-len",
               str(args.max_len), "--temperature", str(args.temperature), "--json", str(path)]
    print("offline:", " ".join(command[1:]), flush=True)
    subprocess.run(command, check=True, cwd=ROOT)
    return json.loads(path.read_text())


def serve_benchmark(args: argparse.Namespace, base_url: str, prompts: list[list[int]], output_lens: list[int],
                    server_pids: dict[str, int] | None = None) -> tuple[list[RequestResult], float, dict[str, float]]:
    """A warm-up (the first prompts, at most a few tokens each, all at once), then the timed run; returns its
    requests, its duration and the share of one CPU core the client and each of `server_pids` used."""
    warmup_lens = [min(WARMUP_TOKENS, n) for n in output_lens[:WARMUP_REQUESTS]]
    asyncio.run(run_load(base_url, prompts[:len(warmup_lens)], warmup_lens, args.temperature, Load(), args.api_key))
    load = Load(args.request_rate, args.max_concurrency, args.seed)
    pids = server_pids or {}
    before = {name: thread_cpu_ns(pid) for name, pid in pids.items()}
    cpu = time.process_time()
    results, duration = asyncio.run(run_load(base_url, prompts, output_lens, args.temperature, load, args.api_key))
    shares = {"client": (time.process_time() - cpu) / duration}
    shares.update({name: cpu_seconds_since(pid, before[name]) / duration for name, pid in pids.items()})
    return results, duration, shares


@dataclass
class ServeReport:
    environment: dict[str, str]
    settings: dict[str, Any]
    serve: ServeMetrics
    requests: list[RequestResult]  # in prompt order
    # of one core, during the timed run: the client's and, where the benchmark started the server, its API
    # process's and its engine core's
    cpu_shares: dict[str, float]
    offline: dict[str, Any] | None  # what benchmarks/throughput.py --json wrote

    @property
    def serve_over_offline(self) -> float | None:
        """Output tokens/s served / offline."""
        return None if self.offline is None else self.serve.output_throughput / self.offline["output_throughput"]

    def json(self) -> str:
        settings = {k: str(v) if isinstance(v, Path) or v == math.inf else v for k, v in self.settings.items()}
        requests = [{k: v for k, v in asdict(r).items() if k != "itl"} for r in self.requests]
        return json.dumps({**asdict(self), "settings": settings, "requests": requests,
                           "serve_over_offline": self.serve_over_offline}, indent=2)

    def text(self) -> str:
        concurrency = self.settings["max_concurrency"] or "unbounded"
        lines = [" | ".join(f"{k} {v}" for k, v in self.environment.items()),
                 f"serve: {self.settings['model']}, {self.settings['num_requests']} requests, request rate "
                 f"{self.settings['request_rate']}, max concurrency {concurrency}",
                 self.serve.text(),
                 "CPU, share of one core during the run: " + ", ".join(
                     f"{_PROCESS_NAMES.get(name, name)} {share:.0%}" for name, share in self.cpu_shares.items())]
        if self.offline is not None:
            offline = self.offline
            lines.append(f"offline (benchmarks/throughput.py, same workload and settings): "
                         f"{offline['output_throughput']:,.0f} output tokens/s in {offline['duration_s']:.2f} s")
            lines.append(f"serve / offline (output tokens/s): {self.serve_over_offline:.1%}")
        return "\n".join(lines)


def run(args: argparse.Namespace) -> ServeReport:
    vocab = resolve_model(args.model, args.load_format, args.tokenizer).config.vocab_size
    prompts, output_lens = workload(args.num_requests, args.min_len, args.max_len, vocab, args.seed)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="wick-serve-bench-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    offline = None if args.no_offline else offline_throughput(args, log_dir)
    if args.base_url is not None:
        results, duration, cpu_shares = serve_benchmark(args, args.base_url, prompts, output_lens)
    else:
        server_args = [*engine_flags(args), "--uvicorn-log-level", "warning",
                       "--max-queued-requests", str(max(1024, args.num_requests))]
        if args.tokenizer is not None:
            server_args += ["--tokenizer", args.tokenizer]
        if args.api_key is not None:
            server_args += ["--api-key", args.api_key]
        server = WickServer(server_args, log_dir / "serve.log")
        try:
            results, duration, cpu_shares = serve_benchmark(args, server.url, prompts, output_lens, server.pids)
        finally:
            server.stop()
    settings = {k: v for k, v in vars(args).items() if k != "api_key"}
    return ServeReport(environment(), settings, ServeMetrics.of(results, duration), results, cpu_shares, offline)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_workload_args(parser)
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument("--tokenizer", default=None, help="the server's tokenizer (a dummy preset has none)")
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    parser.add_argument("--request-rate", type=float, default=math.inf,
                        help="requests per second, Poisson arrivals (default inf: all at once)")
    parser.add_argument("--max-concurrency", type=int, default=None, help="requests in flight at most")
    parser.add_argument("--base-url", default=None, help="a running server instead of starting one")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--no-offline", action="store_true", help="skip the offline run (and the ratio)")
    parser.add_argument("--log-dir", type=Path, default=None, help="the server's log and the offline figures")
    parser.add_argument("--json", type=Path, default=None, help="also write the report to this file")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    report = run(args)
    print(report.text())
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(report.json())
    return 0 if report.serve.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
