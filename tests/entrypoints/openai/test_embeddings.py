"""/v1/embeddings from a real `wick serve` process of all-MiniLM-L6-v2, through the official openai client,
against sentence-transformers; and the 400s between embedding and generation models."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest
from embedding_texts import mixed_texts
from test_bad_requests import assert_error
from wick_server import API_KEY, ServerProcess

MODEL = "all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def embedding_server(tmp_path_factory: pytest.TempPathFactory, minilm_dir: str) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("wick-serve-embed") / "serve.log"
    process = ServerProcess([minilm_dir, "--served-model-name", MODEL, "--api-key", API_KEY], log)
    yield process
    process.stop_cleanly()


@pytest.fixture(scope="module")
def embed_client(embedding_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{embedding_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture()
def embed_http(embedding_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=embedding_server.url, headers={"Authorization": f"Bearer {API_KEY}"},
                      timeout=120) as client:
        yield client
    with httpx.Client(base_url=embedding_server.url, timeout=10) as client:
        assert client.get("/health").status_code == 200


@pytest.fixture(scope="module")
def reference(minilm_dir: str) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(minilm_dir, device="cpu").encode(mixed_texts())


def _min_cosine(ours: np.ndarray, reference: np.ndarray) -> float:
    ours = ours / np.linalg.norm(ours, axis=1, keepdims=True)
    theirs = reference / np.linalg.norm(reference, axis=1, keepdims=True)
    return float((ours * theirs).sum(axis=1).min())


def test_embeddings_match_sentence_transformers(embed_client: openai.OpenAI, reference: np.ndarray,
                                                minilm_dir: str) -> None:
    from transformers import AutoTokenizer

    texts = mixed_texts()
    floats = embed_client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    assert floats.model == MODEL and [d.index for d in floats.data] == list(range(32))
    assert _min_cosine(np.array([d.embedding for d in floats.data]), reference) >= 0.9999
    num_tokens = sum(len(ids) for ids in AutoTokenizer.from_pretrained(minilm_dir)(texts)["input_ids"])
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == num_tokens

    encoded = embed_client.embeddings.create(model=MODEL, input=texts, encoding_format="base64")
    decoded = np.array([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in encoded.data])
    assert decoded.shape == (32, 384)
    np.testing.assert_allclose(decoded, np.array([d.embedding for d in floats.data], dtype=np.float32), atol=1e-6)
    # The client asks for base64 itself when no format is named, and decodes it.
    default = embed_client.embeddings.create(model=MODEL, input=texts[:4])
    assert _min_cosine(np.array([d.embedding for d in default.data]), reference[:4]) >= 0.9999


def test_token_id_inputs(embed_client: openai.OpenAI, reference: np.ndarray, minilm_dir: str) -> None:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(minilm_dir)(mixed_texts()[:3])["input_ids"]
    one = embed_client.embeddings.create(model=MODEL, input=ids[0], encoding_format="float")
    many = embed_client.embeddings.create(model=MODEL, input=ids, encoding_format="float")
    assert len(one.data) == 1 and len(many.data) == 3
    assert _min_cosine(np.array([d.embedding for d in many.data]), reference[:3]) >= 0.9999
    assert one.usage.prompt_tokens == len(ids[0])


@pytest.mark.parametrize(("body", "param"), [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": ["fine", ""]}, "input"),
    ({"input": [[5, 6], []]}, "input"),
    ({"input": [1, "mixed"]}, "input"),
    ({"input": "word " * 300}, "input"),
    ({"input": [7] * 257}, "input"),
    ({"input": [30522]}, "input"),
    ({"input": "hi", "dimensions": 128}, "dimensions"),
    ({"input": "hi", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "hi", "truncate_prompt_tokens": 1000}, "truncate_prompt_tokens"),
    ({"input": "hi", "model": "gpt-4"}, "model"),
])
def test_bad_embedding_requests(embed_http: httpx.Client, body: dict, param: str) -> None:
    status = 404 if param == "model" else 400
    assert_error(embed_http.post("/v1/embeddings", json=body), status, param)


def test_truncate_prompt_tokens(embed_http: httpx.Client) -> None:
    response = embed_http.post("/v1/embeddings", json={"input": "word " * 300, "truncate_prompt_tokens": -1})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens"] == 256


def test_generation_requests_to_an_embedding_model(embed_http: httpx.Client) -> None:
    chat = embed_http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert "embedding model" in assert_error(chat, 400, "model")["message"]
    completion = embed_http.post("/v1/completions", json={"prompt": "hi"})
    assert "embedding model" in assert_error(completion, 400, "model")["message"]


def test_models_lists_the_embedding_model(embed_client: openai.OpenAI) -> None:
    assert [m.id for m in embed_client.models.list().data] == [MODEL]


def test_embedding_request_to_a_chat_model(http: httpx.Client) -> None:
    error = assert_error(http.post("/v1/embeddings", json={"input": "hi"}), 400, "model")
    assert "serves no embeddings" in error["message"]
