"""GET /metrics: Prometheus text with vLLM's metric names, each series twice: under a `wick:` prefix and under
vLLM's own `vllm:`, so that dashboards made for vLLM work unchanged.

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

PREFIXES = ("wick:", "vllm:")
# (metric name without its prefix, help, key in the engine's stats, kind)
_ENGINE_METRICS = (
    ("num_requests_running", "Requests in the running batch.", "num_running", "gauge"),
    ("num_requests_waiting", "Requests waiting to be scheduled.", "num_waiting", "gauge"),
    ("kv_cache_usage_perc", "Share of KV cache blocks in use, from 0 to 1.", "kv_cache_usage", "gauge"),
    ("num_preemptions", "Preemptions of running requests.", "num_preemptions", "counter"),
    ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", "prefix_cache_queries",
     "counter"),
    ("prefix_cache_hits", "Prompt tokens found in the prefix cache.", "prefix_cache_hits", "counter"),
    ("prompt_tokens", "Prompt tokens of requests that produced a token.", "prompt_tokens", "counter"),
    ("generation_tokens", "Generated tokens.", "generation_tokens", "counter"),
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
            for prefix in PREFIXES:
                yield family(prefix + name, documentation, value=value)


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

        def histograms(name: str, documentation: str, buckets: tuple[float, ...]) -> list[Histogram]:
            return [Histogram(prefix + name, documentation, buckets=buckets, registry=self.registry)
                    for prefix in PREFIXES]

        self.ttft = histograms("time_to_first_token_seconds", "Time to the first generated token.", _TTFT_BUCKETS)
        self.tpot = histograms("time_per_output_token_seconds", "Time per generated token after the first.",
                               _TPOT_BUCKETS)
        self.e2e_latency = histograms("e2e_request_latency_seconds", "Time from arrival to the last token.",
                                      _E2E_BUCKETS)

    def collect_latencies(self) -> None:
        for record in self._engine.take_finished_metrics():
            for histogram in self.e2e_latency:
                histogram.observe(record.e2e_latency)
            for histogram in self.ttft if record.time_to_first_token is not None else ():
                histogram.observe(record.time_to_first_token)
            for histogram in self.tpot if record.time_per_output_token is not None else ():
                histogram.observe(record.time_per_output_token)

    def render(self) -> tuple[bytes, str]:
        self.collect_latencies()
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
