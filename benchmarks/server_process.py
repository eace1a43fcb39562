"""`wick serve` as a child process for the server benchmarks: started on a free port, waited for on
/health, read through /proc (resident memory, open file descriptors, CPU time) and /metrics, stopped with
SIGTERM."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

_READY = re.compile(r"engine core pid (\d+)\); ready at (http://\S+) ")


class WickServer:
    def __init__(self, args: list[str], log_path: Path, timeout: float = 600.0) -> None:
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.process = subprocess.Popen([sys.executable, "-m", "wick.cli.main", "serve", "--port", "0", *args],
                                        stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"wick serve exited with {self.process.returncode}:\n{self.log()[-4000:]}")
            match = _READY.search(self.log())
            if match and httpx.get(f"{match.group(2)}/health", timeout=30).status_code == 200:
                self.url, self.core_pid = match.group(2), int(match.group(1))
                return
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"wick serve was not ready in {timeout:.0f} s:\n{self.log()[-4000:]}")
            time.sleep(0.2)

    @property
    def pids(self) -> dict[str, int]:
        return {"api": self.process.pid, "core": self.core_pid}

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metric(self, name: str) -> float:
        text = httpx.get(f"{self.url}/metrics", timeout=30).text
        match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
        if match is None:
            raise KeyError(f"{name} is missing from /metrics")
        return float(match.group(1))

    def stop(self, timeout: float = 120.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self._log.close()
        return code


def rss_bytes(pid: int) -> int:
    """Resident memory of a process, from /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def open_fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def thread_cpu_ns(pid: int) -> dict[int, int]:
    """Nanoseconds of CPU each live thread of a process has run so far, from /proc/PID/task/TID/schedstat; exact
    where /proc/PID/stat counts in clock ticks (10 ms), too coarse for a process that works a few ms in a short run."""
    times = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            times[int(task.name)] = int((task / "schedstat").read_text().split()[0])
        except FileNotFoundError:
            continue
    return times


def cpu_seconds_since(pid: int, before: dict[int, int]) -> float:
    """CPU seconds a process's threads have run since `before` (a `thread_cpu_ns` reading); a thread that exited
    in between is not counted."""
    return sum(ns - before.get(tid, 0) for tid, ns in thread_cpu_ns(pid).items()) / 1e9
