"""kernel_timeline against a hand-made trace: two decode steps of three kernels, a stretch with a prefill's extra
kernel, and host events that are not kernels."""

from __future__ import annotations

import json
import subprocess
import sys

from benchmarks.kernel_timeline import KernelShare, decode_steps, step_timeline


def kernel(name: str, ts: float, dur: float) -> dict:
    return {"cat": "kernel", "name": name, "ts": ts, "dur": dur}


def step(at: float, gemv_starts: float) -> list[dict]:
    """A decode graph at `at`: its first kernel, a GEMV and an attention kernel launched under the GEMV's tail."""
    return [kernel("_decode_inputs_kernel", at, 2.0), kernel("gemv", at + gemv_starts, 10.0),
            kernel("attention", at + gemv_starts + 8.0, 5.0)]


EVENTS = [
    {"cat": "cpu_op", "name": "aten::copy_", "ts": 0.0, "dur": 500.0},
    *step(0.0, 3.0),  # a prefill ran in this step: one kernel more
    kernel("prefill_gemm", 30.0, 20.0),
    *step(100.0, 3.0),
    *step(200.0, 5.0),
]


def test_steps_with_the_usual_kernel_count() -> None:
    steps = decode_steps(EVENTS)
    assert [[k["ts"] for k in s] for s in steps] == [[100.0, 103.0, 111.0], [200.0, 205.0, 213.0]]


def test_each_kernel_adds_its_end_less_the_previous_end() -> None:
    timeline = step_timeline(EVENTS)
    assert timeline.steps == 2
    assert timeline.span_us == (16.0 + 18.0) / 2  # first start to last end
    # gemv: ends 13 after a first kernel ending at 2 (11), then 15 (13); attention: 3 past the gemv's end each time
    assert timeline.shares == [KernelShare("gemv", 12.0, 1.0), KernelShare("attention", 3.0, 1.0)]


def test_a_trace_without_decode_steps() -> None:
    assert step_timeline([kernel("prefill_gemm", 0.0, 5.0)]) == (0, 0.0, [])


def test_command_line(tmp_path) -> None:
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": EVENTS}))
    out = subprocess.run([sys.executable, "-m", "benchmarks.kernel_timeline", str(trace), "--layers", "2"],
                         capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[0].startswith("2 decode steps, 17.0 us of GPU time a step")
    assert out.splitlines()[1].split() == ["12.0", "6.00", "1.0", "gemv"]
