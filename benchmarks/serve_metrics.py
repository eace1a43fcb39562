"""The serving benchmark's figures, as `vllm bench serve` defines them.

Per request the client records when each chunk that carries text arrives. TTFT: from sending the request to
the first such chunk. ITL: every gap between two consecutive such chunks (a chunk that carries several
tokens is one gap, as in vLLM: the server sends what has accumulated when its reader was late). Latency
(E2EL): from sending to the last chunk of the stream. TPOT: (latency - TTFT) / (output tokens - 1), the
output tokens counted by the server's usage. Throughputs divide the completed requests' tokens by the
benchmark's duration, from the first request sent to the last answer received."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class RequestResult:
    prompt_len: int
    output_len: int  # requested (EOS is ignored, so also expected)
    success: bool = False
    error: str = ""
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0  # the server's usage.completion_tokens
    chunks: int = 0  # chunks that carried text


@dataclass(frozen=True)
class Distribution:
    """Milliseconds."""

    mean: float
    median: float
    p99: float

    @classmethod
    def of(cls, seconds: list[float]) -> Distribution:
        values = np.asarray(seconds or [0.0]) * 1000
        return cls(float(values.mean()), float(np.median(values)), float(np.percentile(values, 99)))


@dataclass
class ServeMetrics:
    completed: int
    failed: int
    duration_s: float
    input_tokens: int
    output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    ttft_ms: Distribution
    tpot_ms: Distribution
    itl_ms: Distribution
    e2el_ms: Distribution
    # Completed requests whose output length differs from the one requested (EOS is ignored: none should).
    wrong_length: int
    errors: list[str]

    @classmethod
    def of(cls, results: list[RequestResult], duration_s: float) -> ServeMetrics:
        done = [r for r in results if r.success]
        input_tokens = sum(r.prompt_len for r in done)
        output_tokens = sum(r.output_tokens for r in done)
        itls = [gap for r in done for gap in r.itl]
        tpots = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
        return cls(
            completed=len(done), failed=len(results) - len(done), duration_s=duration_s, input_tokens=input_tokens,
            output_tokens=output_tokens, request_throughput=len(done) / duration_s,
            output_throughput=output_tokens / duration_s,
            total_token_throughput=(input_tokens + output_tokens) / duration_s,
            ttft_ms=Distribution.of([r.ttft for r in done]), tpot_ms=Distribution.of(tpots),
            itl_ms=Distribution.of(itls), e2el_ms=Distribution.of([r.latency for r in done]),
            wrong_length=sum(r.output_tokens != r.output_len for r in done),
            errors=[r.error for r in results if not r.success][:10])

    def text(self) -> str:
        lines = [
            f"successful requests:           {self.completed}",
            f"failed requests:               {self.failed}",
            f"benchmark duration (s):        {self.duration_s:.2f}",
            f"total input tokens:            {self.input_tokens}",
            f"total generated tokens:        {self.output_tokens}",
            f"request throughput (req/s):    {self.request_throughput:.2f}",
            f"output token throughput (tok/s): {self.output_throughput:,.0f}",
            f"total token throughput (tok/s):  {self.total_token_throughput:,.0f}",
        ]
        for name, dist in (("TTFT", self.ttft_ms), ("TPOT", self.tpot_ms), ("ITL", self.itl_ms),
                           ("E2EL", self.e2el_ms)):
            lines.append(f"{name:5s} ms: mean {dist.mean:9.2f}  median {dist.median:9.2f}  p99 {dist.p99:9.2f}")
        if self.wrong_length:
            lines.append(f"{self.wrong_length} completed requests have another output length than requested")
        lines += [f"error: {e}" for e in self.errors]
        return "\n".join(lines)
