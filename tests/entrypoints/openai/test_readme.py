"""The README's first commands, run verbatim (only the port differs) against `wick serve` on the default model
with no flags, as a new user runs them: each gives a short, sensible answer."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from wick_server import ServerProcess

README = Path(__file__).resolve().parents[3] / "README.md"
README_URL = "http://127.0.0.1:8000"


def readme_block(language: str, marker: str) -> str:
    blocks = re.findall(rf"```{language}\n(.*?)```", README.read_text(), re.DOTALL)
    return next(block for block in blocks if marker in block)


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory: pytest.TempPathFactory, smollm2_gguf: str) -> Iterator[ServerProcess]:
    """`wick serve` as the README starts it: no flags (but --port 0, to share the machine)."""
    server = ServerProcess([], tmp_path_factory.mktemp("readme") / "serve.log")
    yield server
    server.stop()


def test_the_readme_curl_answers_briefly(plain_server: ServerProcess):
    command = readme_block("bash", "curl ").replace(README_URL, plain_server.url)
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=300)
    response = json.loads(result.stdout)
    [choice] = response["choices"]
    assert "Paris" in choice["message"]["content"], response
    assert choice["finish_reason"] == "stop" and response["usage"]["completion_tokens"] <= 64, response


def test_the_readme_python_example_answers_briefly(plain_server: ServerProcess):
    code = readme_block("python", "OpenAI(").replace(README_URL, plain_server.url)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md", "exec"), {})
    answer = printed.getvalue()
    assert answer.strip() and len(answer) < 1000, answer
    assert "Hello" in answer or "help" in answer, answer
