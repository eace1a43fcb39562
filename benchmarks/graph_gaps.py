"""Where the GPU's time between two decode graph replays goes, from CUDA events (no profiler)."""

from __future__ import annotations

import itertools
from collections import defaultdict

import torch

from wick.worker.model_runner import ModelRunner


class GraphGaps:
    """CUDA events at the start of each execute_model (before the step's copies) and around each graph replay:
    where the GPU's time between two replays goes, measured without a profiler."""

    def __init__(self) -> None:
        self.steps: list[dict[str, torch.cuda.Event]] = []

    def _event(self, key: str) -> None:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self.steps[-1][key] = event

    def install(self, runner: ModelRunner) -> None:
        execute, replay = runner.execute_model, torch.cuda.CUDAGraph.replay

        def execute_model(*args, **kwargs):
            self.steps.append({})
            self._event("begin")
            return execute(*args, **kwargs)

        def timed_replay(graph):
            self._event("start")
            replay(graph)
            self._event("end")

        runner.execute_model = execute_model
        torch.cuda.CUDAGraph.replay = timed_replay

    def report(self) -> None:
        torch.cuda.synchronize()
        parts: dict[str, list[float]] = defaultdict(list)
        for prev, cur in itertools.pairwise(self.steps):
            if "end" in prev and "start" in cur:
                parts["previous graph's end -> this step's first copy"].append(prev["end"].elapsed_time(cur["begin"]))
                parts["first copy -> graph start (copies, gather, block table)"].append(
                    cur["begin"].elapsed_time(cur["start"]))
                parts["graph"].append(cur["start"].elapsed_time(cur["end"]))
        print(f"GPU time between decode graphs, from CUDA events ({len(parts['graph'])} consecutive graph steps):")
        for key, values in parts.items():
            ordered = sorted(values)
            print(f"  {key}: median {ordered[len(values) // 2] * 1e3:,.1f} us, mean "
                  f"{sum(values) / len(values) * 1e3:,.1f} us, total {sum(values):,.1f} ms")
