"""When the serving benchmark's clients send their requests."""

from __future__ import annotations

import math

import pytest

from benchmarks.serve_client import Load, send_times


def test_an_infinite_rate_sends_everything_at_once():
    assert send_times(5, Load(math.inf)) == [0.0] * 5


def test_a_finite_rate_is_a_seeded_poisson_process():
    times = send_times(4000, Load(request_rate=20.0, seed=3))
    assert times[0] == 0.0
    assert all(b >= a for a, b in zip(times, times[1:], strict=False))
    assert times[-1] / (len(times) - 1) == pytest.approx(1 / 20.0, rel=0.1)
    assert times == send_times(4000, Load(request_rate=20.0, seed=3))
    assert times != send_times(4000, Load(request_rate=20.0, seed=4))
