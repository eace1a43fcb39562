"""The command lines of vLLM, candle-vllm and vllm.rs users, parsed into wick's EngineArgs and serve settings;
the quantization flags (vLLM's and candle-vllm's names); bad values in one line."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from wick.cli.engine_flags import engine_args_from
from wick.cli.main import build_parser, main


def parse(*argv: str):
    return build_parser().parse_args(list(argv))


def test_seed_model_flags():
    assert engine_args_from(parse("serve", "--w", "/models/qwen")).model == "/models/qwen"
    assert engine_args_from(parse("serve", "--f", "/models/q.gguf")).model == "/models/q.gguf"
    repo, file = "unsloth/Qwen3-30B-A3B-Instruct-2507-GGUF", "Qwen3-30B-A3B-Instruct-2507-Q4_K_M.gguf"
    assert engine_args_from(parse("serve", "--m", repo, "--f", file)).model == f"{repo}/{file}"
    with pytest.raises(ValueError, match="--f names a .gguf file"):
        engine_args_from(parse("serve", "--m", "org/repo", "--f", "weights.bin"))


def test_vllm_positional_model_and_its_switches():
    args = parse("serve", "Qwen/Qwen2.5-0.5B-Instruct", "--enable-auto-tool-choice", "--trust-remote-code",
                 "--download-dir", "/data/hf", "--disable-log-requests", "--uvicorn-log-level", "warning",
                 "--tool-call-parser", "hermes", "--generation-config", "vllm")
    engine_args = engine_args_from(args)
    assert engine_args.model == "Qwen/Qwen2.5-0.5B-Instruct" and engine_args.trust_remote_code
    assert engine_args.download_dir == "/data/hf" and engine_args.generation_config == "vllm"
    assert args.uvicorn_log_level == "warning" and args.tool_call_parser == "hermes"
    with pytest.raises(ValueError, match="two models"):
        engine_args_from(parse("serve", "a/b", "--model", "c/d"))


def test_seed_cache_scheduler_and_sampling_flags():
    args = parse("serve", "--mem", "512", "--gpu-memory-fraction", "0.7", "--no-prefix-cache",
                 "--prefill-chunk-size", "1024", "--max-gen-tokens", "300", "--temperature", "0.6", "--top-p", "0.9",
                 "--top-k", "20", "--frequency-penalty", "0.5", "--presence-penalty", "0.25",
                 "--enforce-parser", "qwen", "--ui-server", "--p", "9000", "--log")
    engine_args = engine_args_from(args)
    assert engine_args.kv_cache_memory == 512 << 20 and engine_args.gpu_memory_utilization == 0.7
    assert not engine_args.enable_prefix_caching and engine_args.max_num_batched_tokens == 1024
    assert engine_args.override_generation_config == {"temperature": 0.6, "top_p": 0.9, "top_k": 20,
                                                      "frequency_penalty": 0.5, "presence_penalty": 0.25,
                                                      "max_tokens": 300}
    assert args.tool_call_parser == "qwen" and args.ui and args.port == 9000 and args.log
    assert parse("serve", "--i", "--w", "/models/qwen").interactive  # vllm.rs's interactive chat
    assert engine_args_from(parse("serve", "--prefix-cache")).enable_prefix_caching
    assert engine_args_from(parse("chat", "--temperature", "0")).override_generation_config == {"temperature": 0.0}
    assert parse("generate", "-p", "hi", "--max-tokens", "8").max_tokens == 8
    with pytest.raises(ValueError, match="not both"):
        engine_args_from(parse("serve", "--mem", "64", "--kv-cache-memory", "1000"))


def test_d_is_no_longer_the_dtype():
    """`--d 0,1` names devices in candle-vllm / vllm.rs; only --dtype sets the dtype."""
    try:
        args = parse("serve", "--d", "bf16")
    except SystemExit:
        return
    assert args.dtype == "auto"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_device_cuda_without_cuda_is_one_line():
    result = subprocess.run([sys.executable, "-m", "wick.cli.main", "generate", "--device", "cuda", "--prompt", "hi"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0], result.stderr


def test_every_wick_command_of_the_readme_table_parses(monkeypatch: pytest.MonkeyPatch):
    """The "coming from candle-vllm / vllm.rs" table: each wick command is accepted (--d sets the visible
    devices, restored afterwards)."""
    import re
    import shlex
    from pathlib import Path

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme[readme.index("### Coming from candle-vllm"):readme.index("## Offline API")]
    commands = [shlex.split(cell) for cell in re.findall(r"\| `(wick [^`]+)`", table)]
    assert len(commands) >= 6
    known = build_parser()
    for command in commands:
        args = known.parse_args(command[1:])
        assert engine_args_from(args).model


@pytest.mark.parametrize(("flags", "expected"), [
    ([], None), (["--quantization", "fp8"], "fp8"), (["-q", "Q4_K"], "q4_k"), (["--isq", "q4k"], "q4_k"),
])
def test_quantization_flags(flags: list[str], expected: str | None) -> None:
    args = build_parser().parse_args(["generate", "-p", "hello", *flags])
    assert engine_args_from(args).quantization == expected


def test_unknown_quantization_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "-p", "hello", "--isq", "q9k"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "unknown quantization 'q9k'" in err


def test_task_flag() -> None:
    assert engine_args_from(build_parser().parse_args(["serve", "--task", "embed"])).task == "embed"
    assert engine_args_from(build_parser().parse_args(["serve"])).task == "auto"
