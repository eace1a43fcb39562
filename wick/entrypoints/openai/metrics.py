"""GET /metrics: Prometheus text with vLLM's metric names under a `wick:` prefix.

Gauges and counters are read from the engine's stats at scrape time; the latency histograms are fed
from the engine's records of finished requests, collected at each scrape and by `collect_latencies`,
which the server calls every second so that no record is lost between rare scrapes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from wick.engine.async_engine import AsyncEngine
from wick.entrypoints.openai.admission import Admission

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                 40.0, 80.0)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                480.0, 960.0, 1920.0, 7680.0)

# (metric name, help, key in the engine's stats, kind)
_ENGINE_METRICS = (
    ("wick:num_requests_running", "Requests in the running batch.", "num_running", "gauge"),
    ("wick:num_requests_waiting", "Requests waiting to be scheduled.", "num_waiting", "gauge"),
    ("wick:kv_cache_usage_perc", "Share of KV cache blocks in use, from 0 to 1.", "kv_cache_usage", "gauge"),
    ("wick:num_preemptions", "Preemptions of running requests.", "num_preemptions", "counter"),
    ("wick:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", "prefix_cache_queries",
     "counter"),
    ("wick:prefix_cache_hits", "Prompt tokens found in the prefix cache.", "prefix_cache_hits", "counter"),
    ("wick:prompt_tokens", "Prompt tokens of requests that produced a token.", "prompt_tokens", "counter"),
    ("wick:generation_tokens", "Generated tokens.", "generation_tokens", "counter"),
)


class _EngineCollector:
    """Reads the engine's stats each time Prometheus scrapes."""

    def __init__(self, stats: Callable[[], dict[str, Any]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        for name, documentation, key, kind in _ENGINE_METRICS:
            value = float(stats.get(key, 0) or 0)
            family = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
            yield family(name, documentation, value=value)


class _AdmissionCollector:
    """The requests refused before their body was read, by reason, and the requests waiting to start."""

    def __init__(self, admission: Admission) -> None:
        self._admission = admission

    def collect(self) -> Iterator[Metric]:
        rejected = CounterMetricFamily(
            "wick:num_requests_rejected", "Requests refused on arrival: queue_full (429), draining (503), "
            "too_large (413).", labels=["reason"])
        for reason in ("queue_full", "draining", "too_large"):
            rejected.add_metric([reason], float(self._admission.rejected[reason]))
        yield rejected
        yield GaugeMetricFamily("wick:num_requests_admitted_waiting", "Generation requests in the server that have "
                                "no token yet (the queue that --max-queued-requests bounds).",
                                value=float(self._admission.num_waiting))


class ServerMetrics:
    """The metrics of one engine, in a registry of its own."""

    def __init__(self, engine: AsyncEngine, admission: Admission) -> None:
        self._engine = engine
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_EngineCollector(lambda: engine.stats))
        self.registry.register(_AdmissionCollector(admission))
        self.ttft = Histogram("wick:time_to_first_token_seconds", "Time to the first generated token.",
                              buckets=_TTFT_BUCKETS, registry=self.registry)
        self.tpot = Histogram("wick:time_per_output_token_seconds", "Time per generated token after the first.",
                              buckets=_TPOT_BUCKETS, registry=self.registry)
        self.e2e_latency = Histogram("wick:e2e_request_latency_seconds", "Time from arrival to the last token.",
                                     buckets=_E2E_BUCKETS, registry=self.registry)

    def collect_latencies(self) -> None:
        for record in self._engine.take_finished_metrics():
            self.e2e_latency.observe(record.e2e_latency)
            if record.time_to_first_token is not None:
                self.ttft.observe(record.time_to_first_token)
            if record.time_per_output_token is not None:
                self.tpot.observe(record.time_per_output_token)

    def render(self) -> tuple[bytes, str]:
        self.collect_latencies()
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
