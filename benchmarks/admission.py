"""How fast the server refuses what it will not take, against the real server on the default model.

1. A 20 MB body: the time from the request's first byte to the 413, with the size declared
   (Content-Length: refused before the body is read) and without it (chunked: cut off at the limit).
2. A burst of 10x --max-queued-requests small completions at once, each on its own connection opened
   beforehand: every answer must be a 200 or a 429; the time from a request's send to its 429, p50/p99,
   over --repeats bursts after one uncounted warm-up burst.

Times are taken by the client over loopback, so they bound the server's time from above.

    python -m benchmarks.admission
"""

from __future__ import annotations

import argparse
import asyncio
import json
import select
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import environment
from benchmarks.server_process import WickServer

BODY_BYTES = 20_000_000
_CHUNK = 1 << 16


async def _read_status(reader: asyncio.StreamReader) -> int:
    line = await reader.readline()
    if not line:
        raise ConnectionError("the server closed the connection without an answer")
    return int(line.split()[1])


def time_to_413(host: str, port: int, chunked: bool) -> float:
    """Seconds from the request's first byte to the 413's status line; the body is sent until then.

    The server closes the connection after its 413, so the client looks for the answer before each
    write and reads it even when a write fails."""
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {BODY_BYTES}"
    head = f"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n{framing}\r\n\r\n"
    piece = b"a" * _CHUNK
    block = f"{_CHUNK:x}\r\n".encode() + piece + b"\r\n" if chunked else piece
    with socket.create_connection((host, port), timeout=60) as sock:
        start = time.perf_counter()
        sock.sendall(head.encode())
        pending, remaining = b"", BODY_BYTES // _CHUNK
        while True:
            readable, writable, _ = select.select([sock], [sock] if remaining or pending else [], [], 60)
            if readable:
                break
            if not pending:
                pending, remaining = block, remaining - 1
            try:
                pending = pending[sock.send(pending):]
            except OSError:  # the server closed while the body was still going out
                break
        answer = sock.recv(4096)
        elapsed = time.perf_counter() - start
    status = int(answer.split()[1]) if answer else 0
    if status != 413:
        raise AssertionError(f"expected 413, got {answer[:100]!r}")
    return elapsed


async def burst(host: str, port: int, size: int, max_tokens: int) -> tuple[dict[int, int], list[float], float]:
    """`size` completions at once on connections opened beforehand; returns the count of each status,
    the seconds to each 429, and the seconds until the last answer."""
    connections = [await asyncio.open_connection(host, port) for _ in range(size)]

    async def one(i: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[int, float]:
        body = json.dumps({"prompt": f"Burst request {i}", "max_tokens": max_tokens}).encode()
        writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        start = time.perf_counter()
        status = await _read_status(reader)
        elapsed = time.perf_counter() - start
        await reader.read()
        writer.close()
        return status, elapsed

    start = time.perf_counter()
    results = await asyncio.gather(*(one(i, r, w) for i, (r, w) in enumerate(connections)))
    total = time.perf_counter() - start
    counts: dict[int, int] = {}
    for status, _ in results:
        counts[status] = counts.get(status, 0) + 1
    return counts, [elapsed for status, elapsed in results if status == 429], total


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queue-bound", type=int, default=32, help="the server's --max-queued-requests")
    parser.add_argument("--repeats", type=int, default=20, help="413s of each kind, and bursts")
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("server_args", nargs="*", help="more `wick serve` flags (after --)")
    args = parser.parse_args(argv)
    log_dir = Path(tempfile.mkdtemp(prefix="wick-admission-"))
    server = WickServer(["--max-queued-requests", str(args.queue_bound), *args.server_args], log_dir / "serve.log")
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    failed = False
    try:
        print(json.dumps(environment()))
        for chunked in (False, True):
            times = [time_to_413(host, int(port), chunked) for _ in range(args.repeats)]
            kind = "chunked (no Content-Length)" if chunked else "Content-Length declared"
            print(f"20 MB body, {kind}: 413 in median {statistics.median(times) * 1e3:.2f} ms, "
                  f"max {max(times) * 1e3:.2f} ms over {len(times)}")
        refusals: list[float] = []
        statuses: dict[int, int] = {}
        totals = []
        # One burst first, not counted: the server's first refusals and first generations warm their code paths.
        asyncio.run(burst(host, int(port), 10 * args.queue_bound, args.max_tokens))
        for _ in range(args.repeats):
            counts, to_429, total = asyncio.run(burst(host, int(port), 10 * args.queue_bound, args.max_tokens))
            refusals += to_429
            totals.append(total)
            for status, n in counts.items():
                statuses[status] = statuses.get(status, 0) + n
        failed = set(statuses) - {200, 429} != set()
        print(f"bursts of {10 * args.queue_bound} (10x the queue bound of {args.queue_bound}), {args.repeats} times: "
              f"statuses {dict(sorted(statuses.items()))}; time to a 429 p50 {percentile(refusals, 50) * 1e3:.2f} ms, "
              f"p99 {percentile(refusals, 99) * 1e3:.2f} ms, max {max(refusals) * 1e3:.2f} ms; "
              f"last answer of a burst after median {statistics.median(totals):.2f} s")
    finally:
        server.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
