"""The soak in its short form (benchmarks/soak.py runs the long one): the real server on the default model
under mixed traffic, bursts past the queue bound and bad requests for WICK_SOAK_SECONDS (default 120),
then idle. No 5xx and no wrong answer; the KV cache back to zero used blocks; RSS within 5% and open
file descriptors back to where they were after the warm-up."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks.soak import soak
from benchmarks.soak_traffic import BAD_KINDS

pytestmark = pytest.mark.slow


def test_the_server_holds_under_mixed_traffic_and_leaks_nothing(tmp_path: Path, smollm2_gguf: str):
    report = soak(float(os.environ.get("WICK_SOAK_SECONDS", "120")), warmup_rounds=1, log_dir=tmp_path)
    print(report.text())
    assert report.failures() == [], report.text()
    assert set(report.rss_after) == set(report.fds_after) == {"api", "core"}
    # Every kind of traffic ran, and the bursts went past the queue bound.
    ran = set(report.statuses)
    assert {"chat", "chat_stream", "completion", "completion_stream", "n2", "logprobs", "tool_call", "structured",
            "stop", "disconnect", "burst"} <= ran
    assert {f"bad_request:{kind}" for kind in BAD_KINDS} <= ran
    assert report.statuses["burst"].get(429, 0) > 0
