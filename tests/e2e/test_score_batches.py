"""Score and rerank batches through `nightbatch local`: the OpenAI SDK and plain `requests` against the real
embedding engine, which vLLM's serving layer scores with as a bi-encoder (cosine similarity)."""

from __future__ import annotations

import io
import json
import math
import time
from typing import Any, cast

import pytest
import requests

from tests.e2e.conftest import LocalStack
from tests.e2e.test_local_batches import EMBED, TERMINAL, assert_one_line_per_input, lines_of, wait

pytestmark = pytest.mark.e2e
QUERY = "A cat is sitting on a mat."
DOCS = ["Stock markets fell sharply today.", "The cat sits on the mat.", "A dog sleeps in the sun."]


def test_models_list_score_and_rerank_for_the_embedding_model(local_stack: LocalStack) -> None:
    model = local_stack.client().models.retrieve(EMBED)
    assert (model.model_extra or {})["nightbatch"] == {
        "task": "embed", "endpoints": ["/v1/embeddings", "/v1/score", "/v1/rerank"]}


def test_score_batch_with_the_openai_sdk(local_stack: LocalStack) -> None:
    client = local_stack.client()
    lines = [{"custom_id": f"s{i}", "method": "POST", "url": "/v1/score",
              "body": {"model": EMBED, "text_1": QUERY, "text_2": DOCS}} for i in range(3)]
    lines.append({"custom_id": "s-qd", "method": "POST", "url": "/v1/score",
                  "body": {"model": EMBED, "queries": [QUERY, "Markets"], "documents": DOCS[:2]}})
    # Valid in shape; vLLM's serving layer refuses the value, and only this line fails.
    lines.append({"custom_id": "s-bad", "method": "POST", "url": "/v1/score",
                  "body": {"model": EMBED, "text_1": QUERY, "text_2": DOCS, "max_tokens_per_doc": 100_000}})
    data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    f = client.files.create(file=("score.jsonl", io.BytesIO(data)), purpose="batch")
    # The SDK types `endpoint` as a Literal of OpenAI's endpoints, and sends any other string as it is.
    created = client.batches.create(input_file_id=f.id, endpoint=cast(Any, "/v1/score"), completion_window="24h")
    assert created.endpoint == "/v1/score"
    batch = wait(client, created.id)
    assert batch.status == "completed", batch
    ok, bad = lines_of(client, batch.output_file_id), lines_of(client, batch.error_file_id)
    assert_one_line_per_input(batch, ok, bad, 5)
    print("score output line:", json.dumps(ok[0]))
    print("score error line:", json.dumps(bad[0]))
    assert [r["custom_id"] for r in bad] == ["s-bad"]
    assert bad[0]["response"]["status_code"] == 400
    assert "max_tokens_per_doc" in bad[0]["response"]["body"]["error"]["message"]
    by_id = {r["custom_id"]: r["response"]["body"] for r in ok}
    scores = [d["score"] for d in by_id["s0"]["data"]]
    assert by_id["s0"]["object"] == "list" and by_id["s0"]["model"] == EMBED
    assert [d["index"] for d in by_id["s0"]["data"]] == [0, 1, 2]
    assert scores[1] > 0.8 > 0.3 > scores[0]  # paraphrase vs unrelated sentence
    assert [d["score"] for d in by_id["s1"]["data"]] == scores  # the same pairs score the same
    assert len(by_id["s-qd"]["data"]) == 2 and math.isclose(by_id["s-qd"]["data"][0]["score"], scores[0],
                                                           abs_tol=1e-4)
    assert batch.usage is not None
    assert batch.usage.input_tokens == sum(b["usage"]["prompt_tokens"] for b in by_id.values()) > 0


def test_rerank_batch_with_requests(local_stack: LocalStack) -> None:
    base, auth = local_stack.base_url, {"Authorization": f"Bearer {local_stack.api_key}"}
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/rerank",
              "body": {"model": EMBED, "query": QUERY, "documents": DOCS, "top_n": 2}} for i in range(3)]
    data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    up = requests.post(f"{base}/files", headers=auth, data={"purpose": "batch"},
                       files={"file": ("rerank.jsonl", data, "application/jsonl")}, timeout=30)
    assert up.status_code == 200, up.text
    made = requests.post(f"{base}/batches", headers=auth, timeout=30, json={
        "input_file_id": up.json()["id"], "endpoint": "/v1/rerank", "completion_window": "24h"})
    assert made.status_code == 200, made.text
    batch = made.json()
    deadline = time.monotonic() + 600
    while batch["status"] not in TERMINAL and time.monotonic() < deadline:
        time.sleep(1)
        batch = requests.get(f"{base}/batches/{batch['id']}", headers=auth, timeout=30).json()
    assert batch["status"] == "completed", batch
    assert batch["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    out = requests.get(f"{base}/files/{batch['output_file_id']}/content", headers=auth, timeout=30)
    rows = [json.loads(x) for x in out.text.splitlines()]
    print("rerank output line:", json.dumps(rows[0]))
    assert sorted(r["custom_id"] for r in rows) == ["r0", "r1", "r2"]
    for row in rows:
        body = row["response"]["body"]
        assert row["response"]["status_code"] == 200 and row["error"] is None
        assert [r["index"] for r in body["results"]] == [1, 2]  # top_n: the paraphrase first, then the dog
        assert body["results"][0]["document"]["text"] == DOCS[1]
        assert body["results"][0]["relevance_score"] > body["results"][1]["relevance_score"]
        assert body["usage"]["prompt_tokens"] > 0


def test_a_bad_rerank_line_fails_the_batch_at_validation(local_stack: LocalStack) -> None:
    client = local_stack.client()
    lines = [{"custom_id": "ok", "method": "POST", "url": "/v1/rerank",
              "body": {"model": EMBED, "query": QUERY, "documents": DOCS}},
             {"custom_id": "bad", "method": "POST", "url": "/v1/rerank",
              "body": {"model": EMBED, "query": QUERY, "documents": DOCS, "top_n": -1}}]
    data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    f = client.files.create(file=("rerank.jsonl", io.BytesIO(data)), purpose="batch")
    batch = wait(client, client.batches.create(input_file_id=f.id, endpoint=cast(Any, "/v1/rerank"),
                                               completion_window="24h").id)
    assert batch.status == "failed" and batch.errors is not None and batch.errors.data
    err = batch.errors.data[0]
    assert (err.code, err.line, err.param) == ("invalid_value", 2, "body.top_n")
