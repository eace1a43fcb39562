"""benchmarks/serve.py end to end on the CPU: the offline run and a real `wick serve` process on the small model,
a handful of streamed requests (a Poisson rate, two at a time), and a report that agrees with itself and with the
workload."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from benchmarks.serve import ServeReport, parser, run
from benchmarks.serve_metrics import RequestResult, ServeMetrics
from benchmarks.throughput import workload

pytestmark = pytest.mark.slow

NUM_PROMPTS = 4
MIN_LEN, MAX_LEN = 3, 8


def test_the_serving_benchmark_reports_every_request_with_its_exact_length(tmp_path: Path, small_model_dir: str,
                                                                          monkeypatch: pytest.MonkeyPatch):
    # The offline run and the server run the model as a user's CPU run does: with torch, not interpreted Triton.
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    args = parser().parse_args([
        "--model", small_model_dir, "--load-format", "auto", "--num-prompts", str(NUM_PROMPTS), "--min-len",
        str(MIN_LEN), "--max-len", str(MAX_LEN), "--max-model-len", "64", "--max-num-seqs", "4",
        "--max-concurrency", "2", "--request-rate", "100", "--log-dir", str(tmp_path)])
    report = run(args)
    print(report.text())

    prompts, output_lens = workload(NUM_PROMPTS, MIN_LEN, MAX_LEN, 512, 0)
    serve = report.serve
    assert (serve.completed, serve.failed, serve.wrong_length) == (NUM_PROMPTS, 0, 0), serve.errors
    assert serve.input_tokens == sum(len(p) for p in prompts)
    assert serve.output_tokens == sum(output_lens) == report.offline["output_tokens"]
    for request, prompt, output_len in zip(report.requests, prompts, output_lens, strict=True):
        assert request.success and request.error == ""
        assert (request.prompt_len, request.output_tokens) == (len(prompt), output_len)
        assert 0 < request.ttft <= request.latency
        assert len(request.itl) == request.chunks - 1
        assert 1 <= request.chunks <= output_len
    for dist in (serve.ttft_ms, serve.tpot_ms, serve.itl_ms, serve.e2el_ms):
        assert 0 < dist.median <= dist.p99
        assert dist.mean <= dist.p99
    assert serve.ttft_ms.median <= serve.e2el_ms.median
    assert report.serve_over_offline is not None and report.serve_over_offline > 0
    assert report.serve_over_offline == serve.output_throughput / report.offline["output_throughput"]

    written = json.loads(report.json())
    assert written["serve"]["completed"] == NUM_PROMPTS
    assert written["serve_over_offline"] == report.serve_over_offline
    assert (written["settings"]["request_rate"], written["settings"]["max_concurrency"]) == (100.0, 2)
    assert (tmp_path / "serve.log").exists()
    # the client, the API process and the engine core all worked during the run, none past the machine's cores
    assert set(report.cpu_shares) == {"client", "api", "core"}
    assert all(0 < share <= os.cpu_count() for share in report.cpu_shares.values()), report.cpu_shares


def test_the_json_report_writes_an_infinite_rate_as_a_string_and_leaves_the_gaps_out():
    request = RequestResult(prompt_len=3, output_len=2, success=True, ttft=0.1, latency=0.2, itl=[0.1],
                            output_tokens=2, chunks=2)
    report = ServeReport(environment={"device": "cpu"}, settings={"request_rate": math.inf, "log_dir": Path("/x")},
                         serve=ServeMetrics.of([request], 1.0), requests=[request], cpu_shares={"client": 0.1},
                         offline={"output_throughput": 4.0})
    written = json.loads(report.json())
    assert written["settings"] == {"request_rate": "inf", "log_dir": "/x"}
    assert written["requests"] == [{"prompt_len": 3, "output_len": 2, "success": True, "error": "", "ttft": 0.1,
                                    "latency": 0.2, "output_tokens": 2, "chunks": 2}]
    assert written["serve_over_offline"] == 0.5
