"""The FlashInfer attention backend against the torch reference backend (bf16, on a GPU): attention alone,
decode replayed from a CUDA graph, a small Llama's greedy tokens, and the engine with and without graphs."""

from __future__ import annotations

import gc
import random
from pathlib import Path

import pytest
import torch

pytest.importorskip("flashinfer")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

from wick import LLM, SamplingParams  # noqa: E402
from wick.layers.attention.backend import AttentionBackend  # noqa: E402
from wick.layers.attention.flashinfer_backend import FlashInferAttentionBackend  # noqa: E402
from wick.layers.attention.layer import Attention  # noqa: E402
from wick.layers.attention.metadata import AttentionMetadata  # noqa: E402
from wick.layers.attention.selector import get_attention_backend  # noqa: E402
from wick.layers.attention.torch_backend import TorchAttentionBackend  # noqa: E402

HEAD_DIM, BLOCK = 128, 16
TOL = 2e-2  # bf16


def metadata_for(seq_lens: list[int], query_lens: list[int], tables: list[list[int]], pad_tokens: int = 0,
                 host_tables: bool = True) -> AttentionMetadata:
    """Each request's last query_len tokens are new; pad_tokens trailing tokens belong to no request."""
    slots, starts = [], [0]
    for seq_len, query_len, table in zip(seq_lens, query_lens, tables, strict=True):
        slots += [table[p // BLOCK] * BLOCK + p % BLOCK for p in range(seq_len - query_len, seq_len)]
        starts.append(starts[-1] + query_len)
    width = max(len(t) for t in tables)
    padded = [t + [0] * (width - len(t)) for t in tables]
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots + [-1] * pad_tokens, dtype=torch.int64, device="cuda"),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device="cuda"),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device="cuda"),
        block_tables=torch.tensor(padded, dtype=torch.int32, device="cuda"),
        max_query_len=max(query_lens), max_seq_len=max(seq_lens),
        query_start_loc_cpu=starts, seq_lens_cpu=seq_lens, block_tables_cpu=padded if host_tables else None,
    )


def compare_with_torch_backend(seq_lens: list[int], query_lens: list[int], num_heads: int, num_kv_heads: int,
                               prepare: bool, layer_options: tuple[dict, dict] = ({}, {})) -> None:
    """Two steps through both backends: the cached context first, then the batch over it (3 padding tokens).
    Each step runs two layers on one plan; planned by prepare() or by the first forward()."""
    torch.manual_seed(0)
    num_blocks = sum(-(-n // BLOCK) for n in seq_lens) + 1
    free = (torch.randperm(num_blocks - 1) + 1).tolist()
    tables = [[free.pop() for _ in range(-(-n // BLOCK))] for n in seq_lens]
    shape = (num_blocks, BLOCK, num_kv_heads, HEAD_DIM)
    caches = {name: [[torch.zeros(shape, dtype=torch.bfloat16, device="cuda") for _ in range(2)] for _ in range(2)]
              for name in ("torch", "flashinfer")}
    backends = {"torch": TorchAttentionBackend(), "flashinfer": FlashInferAttentionBackend()}
    cached = [n - q for n, q in zip(seq_lens, query_lens, strict=True)]
    with_context = [i for i, c in enumerate(cached) if c]
    context_lens = [cached[i] for i in with_context]
    # the context step leaves the block ids on the device only: the backend reads them back
    steps = [(context_lens, context_lens, [tables[i] for i in with_context], 0, False),
             (seq_lens, query_lens, tables, 3, True)]
    for step_seq_lens, step_query_lens, step_tables, pad, host_tables in steps:
        if not step_seq_lens:
            continue
        num_tokens = sum(step_query_lens) + pad
        metadata = metadata_for(step_seq_lens, step_query_lens, step_tables, pad, host_tables)
        if prepare:
            backends["flashinfer"].prepare(metadata)
        for layer in range(2):
            q = torch.randn(num_tokens, num_heads, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
            k, v = torch.randn(2, num_tokens, num_kv_heads, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
            out = {name: backend.forward(q, k, v, *caches[name][layer], metadata, HEAD_DIM**-0.5,
                                         **layer_options[layer])
                   for name, backend in backends.items()}
            torch.testing.assert_close(out["flashinfer"], out["torch"], atol=TOL, rtol=TOL)
            assert not out["flashinfer"][num_tokens - pad:].any()
    for mine, theirs in zip(caches["flashinfer"], caches["torch"], strict=True):
        torch.testing.assert_close(mine, theirs, atol=0, rtol=0)


CASES = {
    "prefill": ([1000, 1, 37, 300], [1000, 1, 37, 300]),
    "chunked_prefill": ([1000, 3000, 1025], [200, 500, 1]),
    "decode": ([1000, 1, 3000, 1025, 17], [1, 1, 1, 1, 1]),
    "mixed": ([1000, 1000, 3000, 1025, 1], [1000, 1000, 200, 1, 1]),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("prepare", [True, False])
def test_matches_torch_backend(case: str, group: int, prepare: bool) -> None:
    compare_with_torch_backend(*CASES[case], num_heads=4 * group, num_kv_heads=4, prepare=prepare)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("prepare", [True, False])
def test_sliding_window_and_soft_cap_match_torch_backend(case: str, prepare: bool) -> None:
    """A local layer (window 256, soft-cap) and a global one in the same steps, as Gemma 2 has them."""
    local = {"sliding_window": 256, "logits_soft_cap": 50.0}
    compare_with_torch_backend(*CASES[case], num_heads=8, num_kv_heads=4, prepare=prepare,
                               layer_options=(local, {}))


def test_decode_in_cuda_graph() -> None:
    """Captured once with every request at the longest context; replayed after prepare() with other contexts,
    the padded batch's tail included."""
    torch.manual_seed(0)
    batch, heads, kv_heads, max_len = 8, 16, 4, 4096
    max_pages = max_len // BLOCK
    pages = torch.randperm(batch * max_pages, device="cuda").view(batch, max_pages).int()
    caches = torch.randn(2, batch * max_pages, BLOCK, kv_heads, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(batch, heads, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    k, v = torch.randn(2, batch, kv_heads, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    seq_lens = torch.full((batch,), max_len, dtype=torch.int32, device="cuda")
    slots = torch.empty(batch, dtype=torch.int64, device="cuda")

    def graph_metadata(lens: list[int]) -> AttentionMetadata:
        last = torch.tensor(lens, device="cuda") - 1
        slots.copy_(pages.gather(1, (last // BLOCK)[:, None]).squeeze(1).long() * BLOCK + last % BLOCK)
        seq_lens.copy_(torch.tensor(lens))
        return AttentionMetadata(
            slot_mapping=slots, query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device="cuda"),
            seq_lens=seq_lens, block_tables=pages, max_query_len=1, max_seq_len=max_len,
            query_start_loc_cpu=list(range(batch + 1)), seq_lens_cpu=lens, block_tables_cpu=pages.tolist(),
            cuda_graph=True)

    backend = FlashInferAttentionBackend()
    metadata = graph_metadata([max_len] * batch)
    backend.forward(q, k, v, *caches, metadata, HEAD_DIM**-0.5)  # plans and compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.forward(q, k, v, *caches, metadata, HEAD_DIM**-0.5)
    for lens in ([1, 2, 17, 100, 1000, 2048, 4095, 4096], [4096] * batch, [33] * batch, [1] * batch):
        backend.prepare(graph_metadata(lens))
        graph.replay()
        expected = TorchAttentionBackend().forward(q, k, v, *[c.clone() for c in caches],
                                                   metadata_for(lens, [1] * batch, pages.tolist()), HEAD_DIM**-0.5)
        torch.testing.assert_close(out, expected, atol=TOL, rtol=TOL)


def test_selector_prefers_flashinfer() -> None:
    assert isinstance(get_attention_backend(None, torch.device("cuda")), FlashInferAttentionBackend)
    assert isinstance(get_attention_backend("flashinfer", torch.device("cuda")), FlashInferAttentionBackend)


def assert_follows(reference: list[tuple[list[int], list[dict[int, float]]]], got: list[list[int]]) -> None:
    """Greedy tokens agree with the reference's (per prompt: its tokens and, per position, its top-5 logprobs)
    up to where rounding flips a choice (bf16 logits of this random model come in steps of 1/16, and its
    ties are many): there the reference ranks the chosen token in its top 5 and within 1 logprob of its own.
    Attention over the wrong pages or positions breaks this within the first steps."""
    divergences = []
    for (expected, logprobs), tokens in zip(reference, got, strict=True):
        if tokens != expected:
            i = next(i for i, (a, b) in enumerate(zip(expected, tokens, strict=True)) if a != b)
            top = logprobs[i]
            divergences.append((i, top[expected[i]] - top[tokens[i]] if tokens[i] in top else None))
    assert all(gap is not None and gap < 1.0 for _, gap in divergences), divergences


def test_small_llama_greedy_matches_torch_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """16 greedy tokens of the torch backend, fed back through both backends (teacher forcing: free-running
    bf16 decoding of a random model drifts apart after a few flipped near-ties whatever the backend)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "models"))
    from hf_configs import build_pair, hf_configs, prompts
    from paged_generate import PagedRunner, Sequence

    config = hf_configs()["llama3"]
    config.head_dim = HEAD_DIM
    _, model = build_pair(config)
    model.to(device="cuda", dtype=torch.bfloat16)
    prompt_ids = prompts(config.vocab_size)

    def runner_for(backend: AttentionBackend) -> PagedRunner:
        runner = PagedRunner(model, num_blocks=64, block_size=BLOCK)
        runner.backend = backend
        for module in model.modules():
            if isinstance(module, Attention):
                module.k_cache = module.k_cache.to(device="cuda", dtype=torch.bfloat16)
                module.v_cache = module.v_cache.to(device="cuda", dtype=torch.bfloat16)
        return runner

    new_tokens = 16
    runner = runner_for(TorchAttentionBackend())
    with torch.device("cuda"):  # the runner makes its tensors on the default device
        generated = [tokens for tokens, _ in runner.generate(prompt_ids, new_tokens)]
    logprobs = {}
    for name, backend in (("torch", TorchAttentionBackend()), ("flashinfer", FlashInferAttentionBackend())):
        runner = runner_for(backend)
        seqs = [Sequence(p + g) for p, g in zip(prompt_ids, generated, strict=True)]
        work = [(seq, len(p)) for seq, p in zip(seqs, prompt_ids, strict=True)]
        rows: list[list[torch.Tensor]] = [[] for _ in seqs]
        with torch.device("cuda"):
            for _ in range(new_tokens):
                for logits, row in zip(runner.step(work), rows, strict=True):
                    row.append(logits[-1].float().log_softmax(-1))
                work = [(seq, 1) for seq in seqs]
        logprobs[name] = [torch.stack(row) for row in rows]
    for expected, theirs, mine in zip(generated, logprobs["torch"], logprobs["flashinfer"], strict=True):
        assert theirs.argmax(-1).tolist() == expected
        chosen = mine.argmax(-1)
        # where flashinfer's choice differs, the torch backend ranks it within 0.1 logprob of its own
        margin = theirs.gather(1, torch.tensor(expected, device="cuda")[:, None]) - theirs.gather(1, chosen[:, None])
        assert bool((margin < 0.1).all()), (chosen.tolist(), expected)


VOCAB = 512


@pytest.fixture(scope="module")
def small_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A random Llama with head size 128 (FlashInfer's kernels need 64, 128 or 256) and a word-level tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("small-llama-d128")
    tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="t1", unk_token="t0").save_pretrained(folder)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=HEAD_DIM, max_position_embeddings=1024,
                         initializer_range=0.3, eos_token_id=1, bos_token_id=0)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("enforce_eager", [False, True])
def test_engine_greedy_follows_torch_backend(small_model_dir: str, enforce_eager: bool) -> None:
    """Through the model runner: chunked prefill mixed with decodes, then decode steps replayed from CUDA
    graphs (6 requests padded to the captured size 8) or run eagerly; against the torch backend in bf16
    (against fp32 the bf16 model itself drifts, whatever the attention)."""
    rng = random.Random(0)
    prompts = [[rng.randrange(2, VOCAB) for _ in range(n)] for n in (5, 17, 33, 64, 100, 3)]
    common = dict(device="cuda", dtype="bfloat16", max_num_seqs=16, max_num_batched_tokens=64)
    torch_llm = LLM(small_model_dir, attention_backend="torch", enforce_eager=True, num_kv_blocks=256, **common)
    outputs = torch_llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=5))
    reference = [(o.outputs[0].token_ids, [{t: lp.logprob for t, lp in top.items()} for top in o.outputs[0].logprobs])
                 for o in outputs]
    del torch_llm
    gc.collect()  # the memory profile of the next engine counts every live tensor
    llm = LLM(small_model_dir, attention_backend="flashinfer", enforce_eager=enforce_eager,
              gpu_memory_utilization=0.2, **common)
    assert isinstance(llm.core.executor.worker.runner.backend, FlashInferAttentionBackend)
    assert (llm.core.executor.worker.runner.step_graphs is None) == enforce_eager
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    assert_follows(reference, [o.outputs[0].token_ids for o in llm.generate(prompts, params)])
