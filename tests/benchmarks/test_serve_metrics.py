"""The serving figures as vLLM defines them, on hand-made request records."""

from __future__ import annotations

import pytest

from benchmarks.serve_metrics import Distribution, RequestResult, ServeMetrics


def test_tpot_itl_and_throughputs_follow_vllm():
    # 5 tokens in 3 chunks of text (one chunk carried three tokens): TPOT spreads the decode time over the 4
    # tokens after the first, ITL holds the 2 gaps between chunks.
    a = RequestResult(prompt_len=10, output_len=5, success=True, ttft=0.1, latency=0.5, itl=[0.1, 0.3],
                      output_tokens=5, chunks=3)
    b = RequestResult(prompt_len=20, output_len=2, success=True, ttft=0.2, latency=0.4, itl=[0.2],
                      output_tokens=2, chunks=2)
    one_token = RequestResult(prompt_len=5, output_len=1, success=True, ttft=0.3, latency=0.3, output_tokens=1,
                              chunks=1)
    failed = RequestResult(prompt_len=7, output_len=3, error="HTTP 500: ...")
    metrics = ServeMetrics.of([a, b, one_token, failed], duration_s=2.0)

    assert (metrics.completed, metrics.failed, metrics.errors) == (3, 1, ["HTTP 500: ..."])
    assert (metrics.input_tokens, metrics.output_tokens) == (35, 8)
    assert metrics.request_throughput == pytest.approx(1.5)
    assert metrics.output_throughput == pytest.approx(4.0)
    assert metrics.total_token_throughput == pytest.approx(21.5)
    # TPOT: (0.5 - 0.1) / 4 = 0.1 s and (0.4 - 0.2) / 1 = 0.2 s; a one-token request has none.
    assert metrics.tpot_ms.mean == pytest.approx(150.0)
    assert metrics.itl_ms.mean == pytest.approx(200.0)
    assert metrics.itl_ms.median == pytest.approx(200.0)
    assert metrics.ttft_ms.mean == pytest.approx(200.0)
    assert metrics.e2el_ms.median == pytest.approx(400.0)
    assert metrics.wrong_length == 0


def test_a_short_output_counts_as_a_wrong_length():
    short = RequestResult(prompt_len=3, output_len=4, success=True, ttft=0.1, latency=0.2, itl=[0.1],
                          output_tokens=3, chunks=2)
    assert ServeMetrics.of([short], duration_s=1.0).wrong_length == 1


def test_p99_lies_between_the_median_and_the_largest_value():
    dist = Distribution.of([i / 1000 for i in range(1, 101)])
    assert dist.median == pytest.approx(50.5)
    assert 99.0 <= dist.p99 <= 100.0
