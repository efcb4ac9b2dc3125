"""POST /v1/nightbatch/estimate through the SDK over real HTTP: numbers from the cost model, no batch created,
another tenant's file answered like an unknown one (404)."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from nightbatch.batches.cost import PRICES
from nightbatch.pipeline.sizing import plan_shards
from nightbatch.settings import Settings
from tests.support.tenant_stack import MODEL, Stack, chat_lines


def post_estimate(client: openai.OpenAI, **body: Any) -> dict[str, Any]:
    result: dict[str, Any] = client.post("/nightbatch/estimate", cast_to=object, body=body)  # type: ignore[arg-type]
    return result


@pytest.fixture
def two(make_stack: Any) -> tuple[Stack, openai.OpenAI, openai.OpenAI]:
    stack = make_stack()
    return stack, stack.client(stack.new_key("team-a", "a")), stack.client(stack.new_key("team-b", "b"))


def test_estimate_matches_the_cost_model_and_creates_no_batch(two: Any) -> None:
    _stack, a, b = two
    data = chat_lines(40)
    f = a.files.create(file=("in.jsonl", data), purpose="batch")
    est = post_estimate(a, input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert est["object"] == "nightbatch.estimate"  # a wire name: it does not follow module moves
    assert est["valid"] and est["errors"] == [] and est["requests"] == 40
    lines = data.splitlines()
    assert est["input_tokens"] == sum(len(line) // 4 + 1 for line in lines)
    max_tokens = json.loads(lines[0])["body"].get("max_tokens")
    settings = Settings(deployment={"mode": "local"})
    assert est["expected_output_tokens"] == 40 * (max_tokens or settings.serving.default_max_tokens)
    total = est["input_tokens"] + est["expected_output_tokens"]
    plan = plan_shards(total, 1, settings, 24 * settings.validation.hour_seconds)
    assert est["shard_plan"]["shards"] == plan.shards and est["gpu_seconds"] == round(plan.gpu_seconds, 3)
    price = PRICES[settings.accounting.instance_type]
    for capacity in ("spot", "on-demand"):
        assert est["cost_usd"][capacity] == pytest.approx(plan.gpu_seconds * price[capacity] / 3600, abs=1e-6)
    assert est["cost_usd"]["spot"] < est["cost_usd"]["on-demand"]
    assert est["window_feasible"] is True
    assert list(a.batches.list()) == []  # a dry run

    # Another tenant's file is not there for b: the same 404 as an unknown id.
    with pytest.raises(openai.NotFoundError):
        post_estimate(b, input_file_id=f.id, endpoint="/v1/chat/completions")


def test_invalid_lines_are_reported_not_raised(two: Any) -> None:
    _stack, a, _ = two
    f = a.files.create(file=("in.jsonl", chat_lines(2) + b"{not json\n"), purpose="batch")
    est = post_estimate(a, input_file_id=f.id, endpoint="/v1/chat/completions")
    assert not est["valid"] and est["requests"] == 2
    assert [(e["code"], e["line"]) for e in est["errors"]] == [("invalid_json_line", 3)]
    with pytest.raises(openai.BadRequestError):
        post_estimate(a, input_file_id=f.id, endpoint="/v1/nope")


def test_a_rerank_file_is_all_input(two: Any) -> None:
    """Scoring makes no tokens: a score or rerank line's whole estimate is input."""
    _stack, a, _ = two
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/rerank",
              "body": {"model": "all-MiniLM-L6-v2", "query": "cats", "documents": ["a cat", "a dog"]}}
             for i in range(3)]
    data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    f = a.files.create(file=("in.jsonl", data), purpose="batch")
    est = post_estimate(a, input_file_id=f.id, endpoint="/v1/rerank")
    assert est["valid"] and est["requests"] == 3 and est["model"] == "all-MiniLM-L6-v2"
    assert est["input_tokens"] == sum(len(line) // 4 + 1 for line in data.splitlines())
    assert est["expected_output_tokens"] == 0


def test_a_responses_file_is_estimated(two: Any) -> None:
    """/v1/responses is a batch endpoint (nightbatch.models.spec.ENDPOINTS), so it can be estimated: input from
    each line's bytes, output from its `max_output_tokens`."""
    _stack, a, _ = two
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/responses",
              "body": {"model": MODEL, "input": "hello there", "max_output_tokens": 12}} for i in range(3)]
    data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    f = a.files.create(file=("in.jsonl", data), purpose="batch")
    est = post_estimate(a, input_file_id=f.id, endpoint="/v1/responses")
    assert est["valid"] and est["errors"] == [] and est["requests"] == 3
    assert est["input_tokens"] == sum(len(line) // 4 + 1 for line in data.splitlines())
    assert est["expected_output_tokens"] == 3 * 12
