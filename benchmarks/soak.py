"""Soak: the real server on the default model under mixed traffic for a fixed time, then idle; checks that
nothing leaks.

Traffic (soak_traffic.py, greedy): plain and streamed chat and completions, n=2, logprobs, forced tool calls,
structured output, stop strings, clients that leave mid-stream, bad requests of every kind, and bursts
of several times the queue bound. A warm-up runs every kind a few times first, from as many clients at once
as the traffic, and one burst as large as its (so that the memory those batch sizes and queues take, which the
allocator keeps, is in the warm figure: with one client at a time it was not, and the CI-length soak's core RSS
grew 5.3-5.7% where a 240 s one grew 3.6%, no leak but a high-water mark); the server's resident
memory and open file descriptors (API process and engine core) are read after it and again after the
soak, each time once the server is idle.

Passes when: every answer is a 2xx, the right 4xx or a 429 (no 5xx, no broken connection); the KV cache
is back to zero used blocks; each process's RSS grew by at most --max-rss-growth; the open file
descriptors are back to their warm value.

    python -m benchmarks.soak --duration 600          # the benchmark (10 minutes)
    python -m benchmarks.soak --duration 120 --json   # what the CI test runs
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from benchmarks.server_process import WickServer, open_fds, rss_bytes
from benchmarks.soak_traffic import BAD_KINDS, Outcome, Traffic

API_KEY = "soak-key"
MAX_MODEL_LEN = 2048
MAX_BODY_BYTES = 2 << 20
# How long the server may take to be idle after the traffic stops, and for its sockets to close.
_QUIET_TIMEOUT_S = 180.0
_FD_SETTLE_S = 15.0


@dataclass
class Report:
    duration_s: float
    clients: int
    queue_bound: int
    requests: int = 0
    statuses: dict[str, dict[int, int]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    num_problems: int = 0
    num_5xx: int = 0
    num_429: int = 0
    kv_usage_after: float = -1.0
    waiting_after: float = -1.0
    rss_warm: dict[str, int] = field(default_factory=dict)
    rss_after: dict[str, int] = field(default_factory=dict)
    fds_warm: dict[str, int] = field(default_factory=dict)
    fds_after: dict[str, int] = field(default_factory=dict)
    max_rss_growth: float = 0.05
    server_exit_code: int | None = None

    def add(self, outcomes: list[Outcome]) -> None:
        for outcome in outcomes:
            self.requests += 1
            by_status = self.statuses.setdefault(outcome.scenario, {})
            by_status[outcome.status] = by_status.get(outcome.status, 0) + 1
            self.num_5xx += outcome.status >= 500
            self.num_429 += outcome.status == 429
            if outcome.problem is not None:
                self.num_problems += 1
                if len(self.problems) < 20:
                    self.problems.append(f"{outcome.scenario}: {outcome.problem}")

    def rss_growth(self) -> dict[str, float]:
        return {name: self.rss_after[name] / self.rss_warm[name] - 1 for name in self.rss_warm}

    def failures(self) -> list[str]:
        """What breaks the soak's promises; empty when it passed."""
        found = []
        if self.num_problems or self.num_5xx:
            found.append(f"{self.num_problems} wrong answers ({self.num_5xx} 5xx): {self.problems[:5]}")
        if self.kv_usage_after != 0 or self.waiting_after != 0:
            found.append(f"not idle after the soak: KV cache usage {self.kv_usage_after}, "
                         f"{self.waiting_after} requests waiting")
        for name, growth in self.rss_growth().items():
            if growth > self.max_rss_growth:
                found.append(f"{name} RSS grew by {growth:.1%} (at most {self.max_rss_growth:.0%})")
        for name, warm in self.fds_warm.items():
            if self.fds_after[name] > warm:
                found.append(f"{name} holds {self.fds_after[name]} file descriptors, {warm} when warm")
        if self.server_exit_code not in (None, 0):
            found.append(f"the server exited with {self.server_exit_code}")
        return found

    def text(self) -> str:
        lines = [f"soak: {self.duration_s:.0f} s, {self.clients} clients, queue bound {self.queue_bound}: "
                 f"{self.requests} requests, {self.num_429} answered 429, {self.num_5xx} 5xx, "
                 f"{self.num_problems} wrong"]
        for scenario in sorted(self.statuses):
            counts = ", ".join(f"{status}: {n}" for status, n in sorted(self.statuses[scenario].items()))
            lines.append(f"  {scenario:28s} {counts}")
        growth = self.rss_growth()
        for name in self.rss_warm:
            lines.append(f"  {name}: RSS {self.rss_warm[name] / 2**20:.1f} -> {self.rss_after[name] / 2**20:.1f} MiB "
                         f"({growth[name]:+.2%}), open fds {self.fds_warm[name]} -> {self.fds_after[name]}")
        lines.append(f"  after: KV cache usage {self.kv_usage_after}, waiting {self.waiting_after}")
        failures = self.failures()
        lines.append("PASS" if not failures else "FAIL: " + "; ".join(failures))
        return "\n".join(lines)


def soak(duration_s: float, *, clients: int = 6, queue_bound: int = 8, warmup_rounds: int = 2,
         burst_every_s: float = 20.0, seed: int = 0, max_rss_growth: float = 0.05, log_dir: Path | None = None,
         server_args: list[str] | None = None) -> Report:
    """Starts `wick serve` (the default model unless `server_args` name one), soaks it, stops it."""
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="wick-soak-"))
    args = ["--max-model-len", str(MAX_MODEL_LEN), "--api-key", API_KEY, "--max-queued-requests", str(queue_bound),
            "--max-request-body-bytes", str(MAX_BODY_BYTES), *(server_args or [])]
    server = WickServer(args, log_dir / "serve.log")
    report = Report(duration_s, clients, queue_bound, max_rss_growth=max_rss_growth)
    try:
        asyncio.run(_warm_up(server, report, warmup_rounds, seed))
        _wait_until_quiet(server)
        report.rss_warm = {name: rss_bytes(pid) for name, pid in server.pids.items()}
        report.fds_warm = {name: open_fds(pid) for name, pid in server.pids.items()}
        asyncio.run(_traffic(server, report, duration_s, clients, queue_bound, burst_every_s, seed))
        _wait_until_quiet(server)
        report.kv_usage_after = server.metric("wick:kv_cache_usage_perc")
        report.waiting_after = server.metric("wick:num_requests_waiting") + server.metric(
            "wick:num_requests_admitted_waiting")
        report.rss_after = {name: rss_bytes(pid) for name, pid in server.pids.items()}
        report.fds_after = _settled_fds(server, report.fds_warm)
    finally:
        report.server_exit_code = server.stop()
    return report


def _client(server: WickServer) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    return httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=600,
                             limits=limits)


async def _warm_up(server: WickServer, report: Report, rounds: int, seed: int) -> None:
    """Every kind of request, from as many clients at once as the traffic has, then a burst as large as its:
    the batch sizes and the queue the traffic reaches take their memory before the warm RSS is read."""
    async with _client(server) as client:
        traffic = Traffic(client, MAX_BODY_BYTES, MAX_MODEL_LEN)

        async def every_kind(index: int) -> None:
            rng = random.Random(seed + 1 + index)
            for run in traffic.scenarios.values():
                report.add(await run(rng))
            for kind in BAD_KINDS:
                report.add(await traffic.bad_request(rng, kind))

        for _ in range(rounds):
            await asyncio.gather(*(every_kind(i) for i in range(report.clients)))
            report.add(await traffic.burst(10 * report.queue_bound))


async def _traffic(server: WickServer, report: Report, duration_s: float, clients: int, queue_bound: int,
                   burst_every_s: float, seed: int) -> None:
    deadline = time.monotonic() + duration_s
    async with _client(server) as client:
        traffic = Traffic(client, MAX_BODY_BYTES, MAX_MODEL_LEN)
        names = list(traffic.scenarios)

        async def worker(index: int) -> None:
            rng = random.Random(seed * 1000 + index)
            while time.monotonic() < deadline:
                report.add(await traffic.scenarios[rng.choice(names)](rng))

        async def bursts() -> None:
            while time.monotonic() + burst_every_s < deadline:
                await asyncio.sleep(burst_every_s)
                report.add(await traffic.burst(10 * queue_bound))

        await asyncio.gather(bursts(), *(worker(i) for i in range(clients)))


def _wait_until_quiet(server: WickServer) -> None:
    deadline = time.monotonic() + _QUIET_TIMEOUT_S
    names = ("wick:num_requests_running", "wick:num_requests_waiting", "wick:num_requests_admitted_waiting",
             "wick:kv_cache_usage_perc")
    while any(server.metric(name) != 0 for name in names):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server was not idle {_QUIET_TIMEOUT_S:.0f} s after the traffic stopped")
        time.sleep(0.2)
    time.sleep(1.0)  # the last responses' connections close


def _settled_fds(server: WickServer, warm: dict[str, int]) -> dict[str, int]:
    """Open file descriptors, read until they are back to `warm` or `_FD_SETTLE_S` has passed."""
    deadline = time.monotonic() + _FD_SETTLE_S
    while True:
        now = {name: open_fds(pid) for name, pid in server.pids.items()}
        if all(now[name] <= warm[name] for name in warm) or time.monotonic() > deadline:
            return now
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of traffic after the warm-up")
    parser.add_argument("--clients", type=int, default=6, help="concurrent clients, each one request at a time")
    parser.add_argument("--queue-bound", type=int, default=8, help="the server's --max-queued-requests")
    parser.add_argument("--burst-every", type=float, default=20.0, help="seconds between bursts of 10x the bound")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="also print the report as JSON")
    parser.add_argument("server_args", nargs="*", help="more `wick serve` flags (after --)")
    args = parser.parse_args(argv)
    report = soak(args.duration, clients=args.clients, queue_bound=args.queue_bound, burst_every_s=args.burst_every,
                  seed=args.seed, server_args=args.server_args)
    print(report.text())
    if args.json:
        print(json.dumps(asdict(report)))
    return 1 if report.failures() else 0


if __name__ == "__main__":
    sys.exit(main())
