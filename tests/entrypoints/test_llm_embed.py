"""LLM.embed against the references: sentence-transformers for all-MiniLM-L6-v2 (a BERT encoder, mean pooling,
normalised) and HF transformers' hidden states for a random Qwen3 used as an embedding model (last token)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from embedding_texts import mixed_texts

from wick import LLM
from wick.outputs import EmbeddingRequestOutput
from wick.pooling_params import PoolingParams


def _cosines(outputs: list[EmbeddingRequestOutput], reference: torch.Tensor) -> list[float]:
    ours = torch.tensor([o.outputs.embedding for o in outputs])
    return F.cosine_similarity(ours, reference.float(), dim=-1).tolist()


@pytest.fixture(scope="module")
def minilm(minilm_dir: str) -> LLM:
    return LLM(minilm_dir, device="cpu")


@pytest.fixture(scope="module")
def sentence_transformer(minilm_dir: str):  # noqa: ANN201 - the oracle's own type
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(minilm_dir, device="cpu")


def test_minilm_matches_sentence_transformers(minilm: LLM, sentence_transformer) -> None:  # noqa: ANN001
    texts = mixed_texts()
    outputs = minilm.embed(texts)
    reference = sentence_transformer.encode(texts, convert_to_tensor=True)
    assert min(_cosines(outputs, reference)) >= 0.9999
    assert all(len(o.outputs.embedding) == 384 for o in outputs)
    assert outputs[3].prompt_token_ids == minilm.get_tokenizer()(texts[3])["input_ids"]
    # sentence-transformers normalises (modules.json's Normalize module): so does the model here.
    assert torch.linalg.vector_norm(torch.tensor(outputs[0].outputs.embedding)).item() == pytest.approx(1.0, abs=1e-5)


def test_minilm_token_ids_and_truncation(minilm: LLM, sentence_transformer) -> None:  # noqa: ANN001
    long_text = "word " * 400
    with pytest.raises(ValueError, match="more than this model's maximum of 256"):
        minilm.embed(long_text)
    # truncate_prompt_tokens=-1 cuts at the model's 256 tokens, special tokens kept: as sentence-transformers does.
    [truncated] = minilm.embed(long_text, truncate_prompt_tokens=-1)
    assert len(truncated.prompt_token_ids) == 256
    assert min(_cosines([truncated], sentence_transformer.encode([long_text], convert_to_tensor=True))) >= 0.9999
    [by_ids] = minilm.embed({"prompt_token_ids": truncated.prompt_token_ids})
    assert by_ids.outputs.embedding == pytest.approx(truncated.outputs.embedding, abs=1e-6)
    raw = minilm.embed("The cat sits on the mat.", PoolingParams(normalize=False))[0].outputs.embedding
    assert torch.linalg.vector_norm(torch.tensor(raw)).item() > 1.5


def test_minilm_has_no_matryoshka_dimensions(minilm: LLM) -> None:
    with pytest.raises(ValueError, match="dimensions: this model does not support Matryoshka"):
        minilm.embed("hello", PoolingParams(dimensions=128))


def test_embed_refuses_a_generation_model(tiny_llama_dir: str) -> None:
    llm = LLM(tiny_llama_dir, device="cpu", max_model_len=64)
    with pytest.raises(ValueError, match="embed\\(\\) needs an embedding model"):
        llm.embed("hello")


def _word_tokenizer(folder: Path, vocab: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="t1", unk_token="t0").save_pretrained(folder)


@pytest.fixture(scope="module", params=["qwen3-embedding", "causal-lm"])
def qwen3_embedder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """(folder, HF Qwen3Model, LLM kwargs): Qwen3-Embedding's shape (Qwen3Model weights under a Qwen3ForCausalLM
    config, a sentence-transformers folder with last-token pooling and Normalize, Matryoshka), or a plain
    Qwen3ForCausalLM checkpoint made an embedding model by task="embed"."""
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3Model

    folder = tmp_path_factory.mktemp(request.param)
    config = Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                         initializer_range=0.3, tie_word_embeddings=False)
    torch.manual_seed(0)
    _word_tokenizer(folder, config.vocab_size)
    if request.param == "causal-lm":
        model = Qwen3ForCausalLM(config)
        model.save_pretrained(folder)
        return str(folder), model.model.eval(), {"task": "embed"}
    model = Qwen3Model(config)
    model.save_pretrained(folder)
    saved = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**saved, "architectures": ["Qwen3ForCausalLM"],
                                                    "is_matryoshka": True}))
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 64, "pooling_mode_lasttoken": True, "pooling_mode_mean_tokens": False}))
    return str(folder), model.eval(), {}


def test_decoder_embedding_model_matches_transformers(qwen3_embedder) -> None:  # noqa: ANN001
    folder, hf_model, kwargs = qwen3_embedder
    llm = LLM(folder, device="cpu", max_num_batched_tokens=256, **kwargs)
    assert llm.config.pooler_config is not None and llm.config.pooler_config.pooling_type.value == "last"
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 512, (n,), generator=generator).tolist() for n in (1, 7, 40, 3, 100, 64, 17)]
    outputs = llm.embed(prompts)
    with torch.no_grad():
        reference = torch.stack([F.normalize(hf_model(torch.tensor([p])).last_hidden_state[0, -1], dim=-1)
                                 for p in prompts])
    ours = torch.tensor([o.outputs.embedding for o in outputs])
    torch.testing.assert_close(ours, reference, atol=1e-4, rtol=1e-4)
    if kwargs:  # a plain causal LM is no Matryoshka model
        with pytest.raises(ValueError, match="dimensions"):
            llm.embed(prompts[:1], PoolingParams(dimensions=16))
        return
    short = torch.tensor([o.outputs.embedding for o in llm.embed(prompts, PoolingParams(dimensions=16))])
    torch.testing.assert_close(short, F.normalize(reference[:, :16], dim=-1), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="more than the model's 64 dimensions"):
        llm.embed(prompts[:1], PoolingParams(dimensions=65))


@pytest.mark.gpu
def test_minilm_on_the_gpu_matches_sentence_transformers(minilm_dir: str) -> None:
    from sentence_transformers import SentenceTransformer

    texts = mixed_texts()
    outputs = LLM(minilm_dir, device="cuda", dtype="float32").embed(texts)
    reference = SentenceTransformer(minilm_dir, device="cuda").encode(texts, convert_to_tensor=True).cpu()
    assert min(_cosines(outputs, reference)) >= 0.9999
    half = LLM(minilm_dir, device="cuda", dtype="float16").embed(texts)
    assert min(_cosines(half, reference)) >= 0.999
