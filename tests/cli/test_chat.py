"""`wick chat` in a pseudo-terminal, as a person would use it."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time

PROMPT = "> "


class Terminal:
    def __init__(self, args: list[str], stderr_path: str) -> None:
        self.fd, child_fd = pty.openpty()
        self.stderr = open(stderr_path, "w+")
        self.process = subprocess.Popen([sys.executable, "-m", "wick.cli.main", *args], stdin=child_fd,
                                        stdout=child_fd, stderr=self.stderr, close_fds=True)
        os.close(child_fd)
        self.seen = ""

    def read_until(self, text: str, timeout: float = 120.0) -> str:
        """Everything printed up to and including the next `text`."""
        deadline = time.monotonic() + timeout
        while text not in self.seen:
            remaining = deadline - time.monotonic()
            ready, _, _ = select.select([self.fd], [], [], max(remaining, 0))
            if not ready:
                raise AssertionError(f"no {text!r} in {timeout}s; output: {self.seen!r}; stderr: {self._errors()}")
            try:
                data = os.read(self.fd, 4096)
            except OSError:  # the child closed the terminal
                data = b""
            if not data:
                raise AssertionError(f"wick chat exited before {text!r}; output: {self.seen!r}; "
                                     f"stderr: {self._errors()}")
            self.seen += data.decode(errors="replace").replace("\r\n", "\n")
        head, _, self.seen = self.seen.partition(text)
        return head + text

    def send(self, line: str) -> None:
        os.write(self.fd, line.encode() + b"\n")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        os.close(self.fd)
        self.stderr.close()

    def _errors(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read()[-2000:]


def test_chat_answers_resets_and_exits(tmp_path):
    # No sampling flags: the default model's own defaults must give a short, right answer (issue 16).
    terminal = Terminal(["chat", "--max-model-len", "1024",
                         "--kv-cache-memory", str(64 << 20), "--system", "You are a helpful assistant."],
                        str(tmp_path / "stderr.txt"))
    try:
        assert "/reset" in terminal.read_until(PROMPT)
        terminal.send("What is the capital of France?")
        terminal.read_until("France?\n")  # the terminal's echo of the question
        assert "Paris" in terminal.read_until(PROMPT)
        terminal.send("/reset")
        assert "cleared" in terminal.read_until(PROMPT)
        terminal.send("/exit")
        assert terminal.process.wait(timeout=30) == 0
    finally:
        terminal.close()
