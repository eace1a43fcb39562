"""A streamed request read in a background thread, for tests that act on a server while streams run."""

from __future__ import annotations

import json
import threading

import httpx
from wick_server import ServerProcess


class Stream(threading.Thread):
    """A streamed request read to its end in the background; `started` is set at its first event."""

    def __init__(self, url: str, path: str, body: dict) -> None:
        super().__init__(daemon=True)
        self.url, self.path, self.body = url, path, {**body, "stream": True}
        self.started = threading.Event()
        self.events: list[dict | str] = []
        self.status: int | None = None
        self.broken: httpx.TransportError | None = None

    def run(self) -> None:
        try:
            with httpx.stream("POST", f"{self.url}{self.path}", json=self.body, timeout=120) as response:
                self.status = response.status_code
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        data = line.removeprefix("data: ")
                        self.events.append(data if data == "[DONE]" else json.loads(data))
                        self.started.set()
        except httpx.TransportError as e:  # a server stopped at once cuts its streams off
            self.broken = e
        self.started.set()

    def finish_reasons(self) -> list[str]:
        return [c["finish_reason"] for e in self.events if isinstance(e, dict) for c in e.get("choices", [])
                if c.get("finish_reason")]


def begin(server: ServerProcess, path: str, body: dict) -> Stream:
    stream = Stream(server.url, path, body)
    stream.start()
    assert stream.started.wait(180) and stream.status == 200, stream.events
    return stream
