"""A one-row decode step's split attention left uncombined for the layer that reads it: the Triton backend returns a
PendingCombine whose value is the combined output and whose int8 rows are that output's, rounded as quantize_q8
rounds it; the attention layer asks for it only for one row, and the models decode through it as through the
combined output."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from wick.layers.attention.layer import Attention
from wick.layers.attention.metadata import AttentionMetadata, set_forward_context
from wick.layers.pending_combine import PendingCombine

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
sys.path.insert(0, str(Path(__file__).resolve().parent / "quantization"))

# Without CUDA the kernels run in Triton's interpreter, which must be on when they are defined and run.
INTERPRET = not torch.cuda.is_available()
with pytest.MonkeyPatch.context() as _patch:
    if INTERPRET:
        _patch.setenv("TRITON_INTERPRET", "1")
    import wick.kernels.paged_attention as paged_attention_kernels
    from wick.kernels.int8_activations import quantize_q8
    from wick.layers.attention.triton_backend import TritonAttentionBackend

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HEADS, KV_HEADS, HEAD_DIM, BLOCK = 4, 2, 32, 4


@pytest.fixture(autouse=True)
def splits(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The interpreter's one "SM" never splits the keys: the split choice sees a GPU's SMs."""
    if INTERPRET:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(paged_attention_kernels, "_num_sms", lambda device: 132)
    yield


def _step(seq_lens: list[int], head_dim: int = HEAD_DIM
          ) -> tuple[AttentionMetadata, tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """A decode step of len(seq_lens) requests over random caches (max_seq_len 256, a graph's bound): its metadata,
    q, k, v ([T, H*D], [T, Hkv*D] each) and the caches."""
    torch.manual_seed(0)
    tables = [[1 + 16 * i + p for p in range(-(-n // BLOCK))] for i, n in enumerate(seq_lens)]
    caches = tuple(torch.randn(16 * len(seq_lens) + 1, BLOCK, KV_HEADS, head_dim, device=DEVICE) for _ in range(2))
    slots = [t[(n - 1) // BLOCK] * BLOCK + (n - 1) % BLOCK for t, n in zip(tables, seq_lens, strict=True)]
    width = max(map(len, tables))
    metadata = AttentionMetadata(
        slot_mapping=torch.tensor(slots, device=DEVICE),
        query_start_loc=torch.arange(len(seq_lens) + 1, dtype=torch.int32, device=DEVICE),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=DEVICE),
        max_query_len=1, max_seq_len=256, query_start_loc_cpu=list(range(len(seq_lens) + 1)), seq_lens_cpu=seq_lens)
    tokens = len(seq_lens)
    qkv = (torch.randn(tokens, HEADS * head_dim, device=DEVICE),
           *(torch.randn(tokens, KV_HEADS * head_dim, device=DEVICE) for _ in range(2)))
    return metadata, qkv, caches


def _attend(layer: Attention, metadata: AttentionMetadata, qkv: tuple[torch.Tensor, ...], pending: bool
            ) -> torch.Tensor | PendingCombine:
    with set_forward_context(metadata, TritonAttentionBackend()):
        return layer.forward(*qkv, pending=pending)


def _layer(caches: tuple[torch.Tensor, ...]) -> Attention:
    head_dim = caches[0].shape[-1]
    layer = Attention(HEADS, head_dim, head_dim**-0.5, KV_HEADS)
    layer.bind_kv_cache([cache.clone() for cache in caches])
    return layer


@pytest.mark.parametrize("interleave", [False, True])
def test_a_one_row_step_is_left_uncombined(interleave: bool) -> None:
    metadata, qkv, caches = _step([40])
    expected = _attend(_layer(caches), metadata, qkv, pending=False)
    pending = _attend(_layer(caches), metadata, qkv, pending=True)
    assert isinstance(pending, PendingCombine)
    assert (pending.dtype, pending.columns) == (expected.dtype, HEADS * HEAD_DIM)
    for got, want in zip(pending.int8_rows(interleave), quantize_q8(expected, interleave), strict=True):
        assert torch.equal(got, want)
    assert torch.equal(pending.value(), expected)
    assert pending.value() is pending.value()


def test_more_rows_no_reader_or_narrow_heads_get_the_output() -> None:
    """Two rows, a reader that takes no pending row, heads narrower than a run of 32: the combined output."""
    metadata, qkv, caches = _step([40, 17])
    assert isinstance(_attend(_layer(caches), metadata, qkv, pending=True), torch.Tensor)
    metadata, qkv, caches = _step([40])
    assert isinstance(_attend(_layer(caches), metadata, qkv, pending=False), torch.Tensor)
    metadata, qkv, caches = _step([40], head_dim=16)
    expected = _attend(_layer(caches), metadata, qkv, pending=False)
    assert torch.equal(_attend(_layer(caches), metadata, qkv, pending=True), expected)


@pytest.mark.skipif(torch.cuda.is_available(), reason="Triton's interpreter runs the kernels on CPU tensors")
def test_a_q4_k_model_decodes_through_pending_combines(monkeypatch: pytest.MonkeyPatch) -> None:
    """One sequence's decode steps of a small Llama quantized in situ to Q4_K, float32 on the CPU through the Triton
    backend, its keys split: each layer's output projection (a GGUF layer, which reads pending rows) gets its
    attention's output uncombined and has it combined; the tokens and logits are those of the outputs combined by
    the attention."""
    from paged_generate import PagedRunner
    from quantized_pair import build_ours, small_llama

    from wick.layers.quantization.isq import InSituGGUFConfig

    hf = small_llama()
    ours = build_ours(hf.config, InSituGGUFConfig("q4_k"), hf.state_dict().items())
    monkeypatch.setattr(paged_attention_kernels, "choose_num_splits", lambda programs, max_seq_len, sms: 2)
    prompt = [[5, 17, 42, 9, 77, 3, 8, 11, 2]]
    with monkeypatch.context() as patch:
        patch.setattr(TritonAttentionBackend, "defers_combine", False)
        expected = PagedRunner(ours, backend=TritonAttentionBackend()).generate(prompt, 3)
    combined = []
    value = PendingCombine.value

    def counted(self: PendingCombine) -> torch.Tensor:
        combined.append(self.partials.out.shape[0])
        return value(self)

    monkeypatch.setattr(PendingCombine, "value", counted)
    got = PagedRunner(ours, backend=TritonAttentionBackend()).generate(prompt, 3)
    assert combined == [1] * (2 * len(ours.model.layers))  # two decode steps of one row
    assert got[0][0] == expected[0][0]
    assert torch.equal(got[0][1], expected[0][1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("quantization", ["q4_k", "gptq"])
def test_int8_gemvs_take_the_combines_row(quantization: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Q4_K or GPTQ output projection reading a pending combine: the combine rounds the row for its int8 GEMV (no
    rounding kernel runs), and the projection's output is the one it gives the combined row."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_pending_norm import _layer

    import wick.kernels.gguf_int8_gemv as int8_gemv_kernels
    import wick.kernels.int8_activations as int8_activations
    import wick.kernels.wna16_matmul as wna16_kernels
    from wick.kernels.paged_attention import paged_attention
    from wick.kernels.split_combine import SplitPartials

    o_proj = _layer(quantization).self_attn.o_proj
    torch.manual_seed(0)
    heads, kv_heads, head_dim, pages = 4, 2, 64, 12
    k_cache, v_cache = (torch.randn(pages, 16, kv_heads, head_dim, dtype=torch.bfloat16, device="cuda")
                        for _ in range(2))
    q = torch.randn(1, heads, head_dim, dtype=torch.bfloat16, device="cuda")
    args = (q, k_cache, v_cache, torch.tensor([0, 1], dtype=torch.int32, device="cuda"),
            torch.tensor([150], dtype=torch.int32, device="cuda"),
            torch.arange(pages, dtype=torch.int32, device="cuda").view(1, pages), head_dim**-0.5, 1, 192)
    expected = o_proj(paged_attention(*args, num_splits=4).view(1, heads * head_dim))
    partials = paged_attention(*args, num_splits=4, defer_combine=True)
    assert isinstance(partials, SplitPartials)
    partials.out.fill_(7.0)
    for kernels in (int8_gemv_kernels, wna16_kernels, int8_activations):
        monkeypatch.setattr(kernels, "quantize_q8", lambda *_, **__: pytest.fail("a rounding kernel ran"))
    assert torch.equal(o_proj(PendingCombine(partials)), expected)
    assert torch.equal(partials.out, torch.full_like(partials.out, 7.0))  # rounded as combined, never written
