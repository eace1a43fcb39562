"""How much the server takes on: the body size limit, the bound on waiting requests, the drain's timeout.

Kept free of heavy imports: the CLI reads the defaults and checks the values before the model loads."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoadLimits:
    # Larger bodies get 413. 16 MiB holds any text prompt of a 128k-token context many times over.
    max_body_bytes: int = 16 << 20
    # Generation requests that may wait for their first token; more get 429 with Retry-After.
    max_queued_requests: int = 1024
    # After SIGINT / SIGTERM, how long running requests may take before they are stopped.
    shutdown_timeout: float = 30.0

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1:
            raise ValueError(f"--max-request-body-bytes must be at least 1, got {self.max_body_bytes}")
        if self.max_queued_requests < 1:
            raise ValueError(f"--max-queued-requests must be at least 1, got {self.max_queued_requests}")
        if not self.shutdown_timeout >= 0:
            raise ValueError(f"--shutdown-timeout must be at least 0, got {self.shutdown_timeout}")
