"""The Triton attention backend against the torch reference backend, and its selection."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from wick.layers.attention import selector
from wick.layers.attention.metadata import AttentionMetadata
from wick.layers.attention.selector import get_attention_backend
from wick.layers.attention.torch_backend import TorchAttentionBackend
from wick.layers.rotary import RopeInputs, get_rope

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

# Without CUDA the kernels run in Triton's interpreter, which must be on when they are defined and run.
INTERPRET = not torch.cuda.is_available()
with pytest.MonkeyPatch.context() as _patch:
    if INTERPRET:
        _patch.setenv("TRITON_INTERPRET", "1")
    from wick.layers.attention.triton_backend import TritonAttentionBackend

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def triton_interpreter(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if INTERPRET:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    yield


def metadata_for(seq_lens: list[int], query_lens: list[int], tables: list[list[int]], block_size: int,
                 pad_tokens: int, device: str) -> AttentionMetadata:
    """Each request's last query_len tokens are new; pad_tokens trailing tokens belong to no request."""
    slots, starts = [], [0]
    for seq_len, query_len, table in zip(seq_lens, query_lens, tables, strict=True):
        slots += [table[p // block_size] * block_size + p % block_size for p in range(seq_len - query_len, seq_len)]
        starts.append(starts[-1] + query_len)
    width = max(len(t) for t in tables)
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots + [-1] * pad_tokens, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=device),
        max_query_len=max(query_lens), max_seq_len=max(seq_lens),
        query_start_loc_cpu=starts, seq_lens_cpu=seq_lens,
    )


def compare_with_torch_backend(seq_lens: list[int], query_lens: list[int], num_heads: int, num_kv_heads: int,
                               head_dim: int, block_size: int, dtype: torch.dtype, device: str,
                               **options: float) -> None:
    """Two steps through both backends: the cached context first, then a mixed batch over it."""
    torch.manual_seed(0)
    num_blocks = sum(-(-n // block_size) for n in seq_lens) + 1
    free = (torch.randperm(num_blocks - 1) + 1).tolist()
    tables = [[free.pop() for _ in range(-(-n // block_size))] for n in seq_lens]
    caches = {name: [torch.zeros(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=device)
                     for _ in range(2)] for name in ("torch", "triton")}
    backends = {"torch": TorchAttentionBackend(), "triton": TritonAttentionBackend()}
    cached = [n - q for n, q in zip(seq_lens, query_lens, strict=True)]
    with_context = [i for i, c in enumerate(cached) if c]
    steps = [([cached[i] for i in with_context], [cached[i] for i in with_context],
              [tables[i] for i in with_context], 0),
             (seq_lens, query_lens, tables, 3)]
    for step_seq_lens, step_query_lens, step_tables, pad in steps:
        num_tokens = sum(step_query_lens) + pad
        q = torch.randn(num_tokens, num_heads, head_dim, dtype=dtype, device=device)
        k, v = torch.randn(2, num_tokens, num_kv_heads, head_dim, dtype=dtype, device=device)
        metadata = metadata_for(step_seq_lens, step_query_lens, step_tables, block_size, pad, device)
        out = {name: backend.forward(q, k, v, *caches[name], metadata, head_dim**-0.5, **options)
               for name, backend in backends.items()}
        tol = 2e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(out["triton"], out["torch"], atol=tol, rtol=tol)
        for mine, theirs in zip(caches["triton"], caches["torch"], strict=True):
            torch.testing.assert_close(mine, theirs, atol=0, rtol=0)


@pytest.mark.parametrize("options", [{"sliding_window": 5}, {"sliding_window": 16, "logits_soft_cap": 3.0},
                                     {"logits_soft_cap": 30.0}])
def test_window_and_soft_cap_match_the_masked_sdpa_backend(options: dict) -> None:
    # prefills, a chunk over cached context and decodes, all past the window
    compare_with_torch_backend([40, 70, 23, 9], [40, 6, 1, 1], num_heads=4, num_kv_heads=2, head_dim=16,
                               block_size=4, dtype=torch.float32, device=DEVICE, **options)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("group", [1, 4])
def test_matches_torch_backend(dtype: torch.dtype, group: int) -> None:
    compare_with_torch_backend([1, 9, 17, 30], [1, 9, 5, 1], num_heads=2 * group, num_kv_heads=2, head_dim=16,
                               block_size=4, dtype=dtype, device=DEVICE)


def test_selector(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(get_attention_backend("triton", torch.device("cpu")), TritonAttentionBackend)
    assert isinstance(get_attention_backend(None, torch.device("cpu")), TorchAttentionBackend)
    monkeypatch.delitem(selector._BACKENDS, "flashinfer", raising=False)
    assert isinstance(get_attention_backend(None, torch.device("cuda")), TritonAttentionBackend)
    assert TritonAttentionBackend.supports_cuda_graph


@pytest.mark.skipif(torch.cuda.is_available(), reason="Triton's interpreter runs the kernels on CPU tensors")
@pytest.mark.parametrize("name", ["llama3", "qwen3", "mistral_window"])
def test_models_decode_rotating_in_the_attention(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two sequences, float32 on the CPU, with the rotary kernel standing in for CUDA's (Triton's interpreter, as the
    attention): the decode steps launch no rotary kernel, their attention rotates q and k (q/k norms first: Qwen3)
    and writes the cache, and the tokens and logits are those of the torch backend."""
    from hf_configs import build_pair, hf_configs
    from paged_generate import PagedRunner

    import wick.kernels.rotary as rotary_kernels
    from wick.layers import rotary

    config = hf_configs()[name]
    _, ours = build_pair(config)
    prompts = [[5, 17, 42, 9, 77, 3, 8, 11, 2], [3, 8]]  # the first runs past mistral_window's 8 keys
    expected = PagedRunner(ours).generate(prompts, 3)
    rotations = []
    kernel = rotary_kernels.rotary_embedding

    def counted(*args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        rotations.append(args[0].shape[0])
        return kernel(*args, **kwargs)

    monkeypatch.setattr(rotary, "runs_rotary_kernel", lambda q: True)
    monkeypatch.setattr(rotary_kernels, "rotary_embedding", counted)
    got = PagedRunner(ours, backend=TritonAttentionBackend()).generate(prompts, 3)
    assert rotations == [sum(map(len, prompts))] * config.num_hidden_layers  # the prefill's, none at decode
    for (tokens, logits), (expected_tokens, expected_logits) in zip(got, expected, strict=True):
        assert tokens == expected_tokens
        torch.testing.assert_close(logits, expected_logits, atol=1e-4, rtol=1e-4)


def test_rope_and_kv_written_exclude_each_other() -> None:
    metadata = metadata_for([3], [1], [[1]], 4, 0, "cpu")
    q, k = torch.zeros(1, 2, 16), torch.zeros(1, 1, 16)
    caches = torch.zeros(2, 2, 4, 1, 16)
    rope = RopeInputs(get_rope(16, 8, 10000.0).cos_sin_cache, None, 1e-6)
    with pytest.raises(ValueError, match="cannot be in the cache already"):
        TritonAttentionBackend().forward(q, k, k, *caches, metadata, 0.25, kv_written=True, rope=rope)


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@requires_cuda
def test_matches_torch_backend_bf16_cuda() -> None:
    compare_with_torch_backend([1000, 1000, 3000, 1025, 1], [1000, 1000, 200, 1, 1], num_heads=16, num_kv_heads=8,
                               head_dim=128, block_size=16, dtype=torch.bfloat16, device="cuda")


@pytest.mark.gpu
@requires_cuda
def test_decode_in_cuda_graph() -> None:
    """Captured once with the longest context as max_seq_len, replayed over other contexts."""
    torch.manual_seed(0)
    batch, heads, kv_heads, head_dim, block_size, max_len = 8, 16, 8, 128, 16, 4096
    max_pages = max_len // block_size
    pages = torch.randperm(batch * max_pages, device="cuda").view(batch, max_pages).int()
    caches = torch.randn(2, batch * max_pages, block_size, kv_heads, head_dim, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(batch, heads, head_dim, dtype=torch.bfloat16, device="cuda")
    k, v = torch.randn(2, batch, kv_heads, head_dim, dtype=torch.bfloat16, device="cuda")
    seq_lens = torch.full((batch,), max_len, dtype=torch.int32, device="cuda")
    slots = torch.empty(batch, dtype=torch.int64, device="cuda")
    metadata = AttentionMetadata(
        slot_mapping=slots, query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device="cuda"),
        seq_lens=seq_lens, block_tables=pages, max_query_len=1, max_seq_len=max_len,
        query_start_loc_cpu=list(range(batch + 1)), seq_lens_cpu=[max_len] * batch)
    backend = TritonAttentionBackend()

    def set_lens(lens: torch.Tensor) -> None:
        seq_lens.copy_(lens)
        last = (lens - 1).long()
        slots.copy_(pages.gather(1, (last // block_size)[:, None]).squeeze(1).long() * block_size + last % block_size)

    set_lens(seq_lens.clone())
    backend.forward(q, k, v, *caches, metadata, head_dim**-0.5)  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.forward(q, k, v, *caches, metadata, head_dim**-0.5)
    for lens in ([1, 2, 17, 100, 1000, 2048, 4095, 4096], [4096] * batch, [33] * batch):
        lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
        set_lens(lens)
        graph.replay()
        eager = metadata_for(lens.tolist(), [1] * batch, pages.tolist(), block_size, 0, "cuda")
        expected = TorchAttentionBackend().forward(q, k, v, *[c.clone() for c in caches], eager, head_dim**-0.5)
        torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)


def _prefill_graph_case(device: str, prompt_lens: list[int], tokens: int, max_len: int,
                        run: Callable[..., list[torch.Tensor]]) -> None:
    """A prefill graph's attention: metadata made for `tokens` queries of one request and max_seq_len the bound,
    then each prompt of prompt_lens given on the device only (query_start_loc, seq_lens, slots). run(forward,
    set_prompt, prompt_lens) returns the outputs. Rows past the prompt (NaN in q) come out zero, and the prompt's
    rows match the torch backend's on the prompt's own metadata."""
    torch.manual_seed(0)
    heads, kv_heads, head_dim, block_size = 4, 2, 16, 4
    pages = torch.randperm(max_len // block_size, device=device).int()[None]
    caches = torch.zeros(2, max_len // block_size, block_size, kv_heads, head_dim, device=device)
    q_prompt = torch.randn(tokens, heads, head_dim, device=device)
    q = q_prompt.clone()
    k, v = torch.randn(2, tokens, kv_heads, head_dim, device=device)
    slots = torch.full((tokens,), -1, dtype=torch.int64, device=device)
    starts = torch.tensor([0, tokens], dtype=torch.int32, device=device)
    seq_lens = torch.tensor([tokens], dtype=torch.int32, device=device)
    metadata = AttentionMetadata(
        slot_mapping=slots, query_start_loc=starts, seq_lens=seq_lens, block_tables=pages, max_query_len=tokens,
        max_seq_len=max_len, query_start_loc_cpu=[0, tokens], seq_lens_cpu=[tokens], cuda_graph=True)
    backend = TritonAttentionBackend()

    def set_prompt(n: int) -> None:
        q.copy_(q_prompt)
        q[n:] = float("nan")
        starts[1], seq_lens[0] = n, n
        positions = torch.arange(n, device=device)
        slots.fill_(-1)
        slots[:n] = pages[0, positions // block_size].long() * block_size + positions % block_size

    outs = run(lambda: backend.forward(q, k, v, *caches, metadata, head_dim**-0.5), set_prompt, prompt_lens)
    for n, out in zip(prompt_lens, outs, strict=True):
        eager = metadata_for([n], [n], pages.tolist(), block_size, 0, device)
        expected = TorchAttentionBackend().forward(q_prompt[:n], k[:n], v[:n], *torch.zeros_like(caches), eager,
                                                   head_dim**-0.5)
        torch.testing.assert_close(out[:n], expected, atol=1e-4, rtol=1e-4)
        assert (out[n:] == 0).all()


def test_prefill_graph_rows_of_no_request_are_zero() -> None:
    def run(forward, set_prompt, prompt_lens):
        outs = []
        for n in prompt_lens:
            set_prompt(n)
            outs.append(forward().clone())
        return outs

    _prefill_graph_case(DEVICE, [3, 16, 9], tokens=16, max_len=64, run=run)


@pytest.mark.gpu
@requires_cuda
def test_prefill_in_cuda_graph() -> None:
    """Captured once at 128 tokens, replayed for shorter prompts."""
    def run(forward, set_prompt, prompt_lens):
        set_prompt(128)
        forward()  # compiles outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = forward()
        outs = []
        for n in prompt_lens:
            set_prompt(n)
            graph.replay()
            outs.append(out.clone())
        return outs

    _prefill_graph_case("cuda", [1, 77, 128, 100], tokens=128, max_len=4096, run=run)
