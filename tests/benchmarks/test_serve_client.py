"""When the serving benchmark's clients send their requests, and the HTTP they speak."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.serve_client import Dechunker, Load, Server, send_times


def test_an_infinite_rate_sends_everything_at_once():
    assert send_times(5, Load(math.inf)) == [0.0] * 5


def test_a_finite_rate_is_a_seeded_poisson_process():
    times = send_times(4000, Load(request_rate=20.0, seed=3))
    assert times[0] == 0.0
    assert all(b >= a for a, b in zip(times, times[1:], strict=False))
    assert times[-1] / (len(times) - 1) == pytest.approx(1 / 20.0, rel=0.1)
    assert times == send_times(4000, Load(request_rate=20.0, seed=3))
    assert times != send_times(4000, Load(request_rate=20.0, seed=4))


def test_the_dechunker_joins_chunks_split_anywhere_and_sees_the_end():
    body = [b"data: {\"a\": 1}\n\n", b"x" * 300, b"data: [DONE]\n\n"]
    wire = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(c), c) for c in body) + b"0\r\n\r\n"
    for cut in (1, 2, 5, 17, len(wire)):
        dechunker, out = Dechunker(), b""
        for i in range(0, len(wire), cut):
            assert not dechunker.ended
            out += dechunker.feed(wire[i:i + cut])
        assert out == b"".join(body) and dechunker.ended


def test_a_request_is_one_http_11_post_with_its_length_and_key():
    server = Server.of("http://127.0.0.1:8123", "sk-1")
    assert (server.host, server.port) == ("127.0.0.1", 8123)
    raw = server.post("/v1/completions", {"prompt": [1, 2]})
    head, body = raw.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/completions HTTP/1.1"
    assert b"Authorization: Bearer sk-1" in lines and b"Content-Length: %d" % len(body) in lines
    assert json.loads(body) == {"prompt": [1, 2]}
    assert Server.of("http://[::1]:9000").headers.startswith(b"Host: [::1]:9000\r\n")
    with pytest.raises(ValueError, match="plain HTTP"):
        Server.of("https://example.com")
