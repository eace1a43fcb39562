"""`wick serve` as a real process for tests: started on a port of its own choosing (--port 0, read back
from its log), waited for on /health, stopped with SIGTERM."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from processes import process_exists

API_KEY = "test-key"
_READY = re.compile(r"engine core pid (\d+)\); ready at (http://\S+) ")


class ServerProcess:
    def __init__(self, args: list[str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.process = subprocess.Popen([sys.executable, "-m", "wick.cli.main", "serve", "--port", "0", *args],
                                        stdout=self._log, stderr=subprocess.STDOUT)
        self.url, self.core_pid = self._wait_until_ready()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _wait_until_ready(self, timeout: float = 300.0) -> tuple[str, int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"wick serve exited with {self.process.returncode}:\n{self.log()[-4000:]}")
            match = _READY.search(self.log())
            if match:
                url = match.group(2)
                if httpx.get(f"{url}/health", timeout=10).status_code == 200:
                    return url, int(match.group(1))
            time.sleep(0.2)
        self.stop()
        raise AssertionError(f"wick serve was not ready in {timeout}s:\n{self.log()[-4000:]}")

    def wait(self, timeout: float = 60.0) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"wick serve did not exit in {timeout}s:\n{self.log()[-4000:]}") from None

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        code = self.wait()
        self._log.close()
        return code

    def stop_cleanly(self) -> None:
        """Stops the server; it must exit with 0 and take its engine core with it."""
        assert self.stop() == 0, self.log()[-4000:]
        assert not process_exists(self.core_pid)


def metric(http: httpx.Client, name: str) -> float:
    text = http.get("/metrics").text
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} is missing from /metrics"
    return float(match.group(1))
