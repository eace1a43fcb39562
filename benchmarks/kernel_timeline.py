"""What each kernel adds to a decode step's GPU time, from a torch profiler Chrome trace (`python -m
benchmarks.step_breakdown ... --profile-steps N --trace FILE`): each kernel's end less the end of the kernel before it,
so that a kernel that overlaps its predecessor (programmatic dependent launch) counts only the time it extends the
step by, summed by kernel name over the decode steps and divided by their count. A decode step runs from one decode
graph's first kernel (`_decode_inputs_kernel`) to the next; of those stretches only the ones with the most common
kernel count are kept, which leaves out a step that also ran a prefill and a stretch cut short by the trace's end.

    python -m benchmarks.kernel_timeline TRACE [--layers 48]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from typing import NamedTuple

STEP_START = "_decode_inputs_kernel"


class KernelShare(NamedTuple):
    name: str
    us_per_step: float
    calls_per_step: float


class StepTimeline(NamedTuple):
    steps: int
    span_us: float  # a step's mean GPU time, its first kernel's start to its last one's end
    shares: list[KernelShare]  # largest first


def decode_steps(events: list[dict]) -> list[list[dict]]:
    """The trace's kernels (category "kernel") in start order, cut at each STEP_START; the stretches with the most
    common kernel count."""
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    starts = [i for i, e in enumerate(kernels) if e["name"].startswith(STEP_START)]
    if not starts:
        return []
    stretches = [kernels[a:b] for a, b in zip(starts, [*starts[1:], len(kernels)], strict=True)]
    usual = Counter(len(s) for s in stretches).most_common(1)[0][0]
    return [s for s in stretches if len(s) == usual]


def step_timeline(events: list[dict]) -> StepTimeline:
    """Each kernel name's mean added time and calls a decode step (the step's first kernel adds nothing: what comes
    before it is the host's)."""
    steps = decode_steps(events)
    added: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    span = 0.0
    for step in steps:
        span += _end(step[-1]) - step[0]["ts"]
        for before, kernel in zip(step[:-1], step[1:], strict=True):
            added[kernel["name"]] += _end(kernel) - _end(before)
            calls[kernel["name"]] += 1
    n = max(len(steps), 1)
    shares = [KernelShare(name, added[name] / n, calls[name] / n) for name in added]
    return StepTimeline(len(steps), span / n, sorted(shares, key=lambda s: -s.us_per_step))


def _end(event: dict) -> float:
    return event["ts"] + event["dur"]


def print_timeline(timeline: StepTimeline, layers: int | None = None) -> None:
    per = f", us a layer of {layers}" if layers else ""
    print(f"{timeline.steps} decode steps, {timeline.span_us:,.1f} us of GPU time a step; what each kernel adds "
          f"(us a step{per}, calls a step):")
    for share in timeline.shares:
        layer = f"{share.us_per_step / layers:8.2f}" if layers else ""
        print(f"  {share.us_per_step:9.1f}{layer} {share.calls_per_step:7.1f}  {share.name[:90]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace")
    parser.add_argument("--layers", type=int, default=None, help="also divide by this many layers")
    args = parser.parse_args()
    with open(args.trace) as f:
        events = json.load(f)["traceEvents"]
    print_timeline(step_timeline(events), args.layers)


if __name__ == "__main__":
    main()
