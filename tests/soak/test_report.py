"""The soak's verdict: each promise it checks fails the report when broken."""

from __future__ import annotations

from benchmarks.soak import Report
from benchmarks.soak_traffic import Outcome, _expect


def clean() -> Report:
    report = Report(duration_s=1, clients=1, queue_bound=1, kv_usage_after=0.0, waiting_after=0.0,
                    rss_warm={"api": 1000, "core": 2000}, rss_after={"api": 1040, "core": 2000},
                    fds_warm={"api": 20, "core": 10}, fds_after={"api": 20, "core": 9}, server_exit_code=0)
    report.add([Outcome("chat", 200), Outcome("burst", 429), _expect("bad_request:json", 400, {400})])
    return report


def test_a_clean_soak_passes():
    assert clean().failures() == []


def test_each_broken_promise_fails_the_soak():
    broken = [
        ("5xx", lambda r: r.add([_expect("chat", 500, set())])),
        ("wrong 4xx", lambda r: r.add([_expect("bad_request:field", 422, {400})])),
        ("kv", lambda r: setattr(r, "kv_usage_after", 0.01)),
        ("waiting", lambda r: setattr(r, "waiting_after", 1.0)),
        ("rss", lambda r: r.rss_after.update(core=2101)),
        ("fds", lambda r: r.fds_after.update(api=21)),
        ("exit", lambda r: setattr(r, "server_exit_code", 1)),
    ]
    for name, breaks in broken:
        report = clean()
        breaks(report)
        assert report.failures(), name
