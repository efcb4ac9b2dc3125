"""Several models and a LoRA adapter in batches, through the OpenAI SDK on the session stack's real engine.

The stack serves SmolLM2 with a random LoRA adapter and allows multi-model batches (tests/support/
local_stack.py). The two-model batch names SmolLM2 and its adapter: two models to the user (counts, usage and
cost under `nightbatch.models`), one engine on this machine, so the test starts no second one; batches naming
two separately served models are covered on the deterministic engine (tests/validation/test_multi_model.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.conftest import LocalStack
from tests.e2e.sdk import submit, wait
from tests.e2e.test_local_batches import CHAT, chat, lines_of
from tests.support.local_stack import LORA_ADAPTER

pytestmark = pytest.mark.e2e
PROMPTS = ["Name a colour.", "Say hello to Ada.", "What is 2 + 2?"]


def line(i: int, model: str, prompt: str) -> dict[str, Any]:
    row = chat(i, prompt, max_tokens=12)
    row["custom_id"] = f"{model}-{i}"
    row["body"]["model"] = model
    return row


def answers(rows: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    return {r["custom_id"]: (r["response"]["body"]["model"], r["response"]["body"]["choices"][0]["message"]
                             ["content"]) for r in rows}


def test_models_lists_the_adapter_under_its_model(local_stack: LocalStack) -> None:
    listed = {m.id: m for m in local_stack.client().models.list()}
    extra = listed[LORA_ADAPTER].model_extra or {}
    assert extra["nightbatch"]["parent"] == CHAT and extra["nightbatch"]["root"] == CHAT
    assert "parent" not in (listed[CHAT].model_extra or {})["nightbatch"]


def test_lora_batch_is_answered_by_the_adapter(local_stack: LocalStack) -> None:
    client = local_stack.client()
    batch = wait(client, submit(client, [line(i, LORA_ADAPTER, p) for i, p in enumerate(PROMPTS)],
                                "/v1/chat/completions").id, timeout=300)
    assert batch.status == "completed", batch.errors
    assert batch.model == LORA_ADAPTER and batch.request_counts is not None
    assert batch.request_counts.completed == len(PROMPTS)
    got = answers(lines_of(client, batch.output_file_id))
    assert {model for model, _ in got.values()} == {LORA_ADAPTER} and all(text for _, text in got.values())
    print("\nLoRA batch:", batch.id, json.dumps(got))


def test_two_model_batch_reports_each_model(local_stack: LocalStack) -> None:
    client = local_stack.client()
    rows = [line(i, m, p) for i, p in enumerate(PROMPTS) for m in (CHAT, LORA_ADAPTER)]
    batch = wait(client, submit(client, rows, "/v1/chat/completions").id, timeout=300)
    assert batch.status == "completed", batch.errors
    assert batch.model == CHAT  # the first line's model
    got = answers(lines_of(client, batch.output_file_id))
    assert len(got) == len(rows) and all(got[f"{m}-{i}"][0] == m for m in (CHAT, LORA_ADAPTER)
                                         for i in range(len(PROMPTS)))
    # Greedy decoding: every prompt answered differently shows the adapter's weights applied to its lines and
    # to no base line that shared an engine step with them (the CPU workaround in gpu_worker/engines/lora.py).
    assert all(got[f"{CHAT}-{i}"][1] != got[f"{LORA_ADAPTER}-{i}"][1] for i in range(len(PROMPTS)))
    models = (batch.model_extra or {})["nightbatch"]["models"]
    assert set(models) == {CHAT, LORA_ADAPTER}
    for name in (CHAT, LORA_ADAPTER):
        assert models[name]["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
        assert models[name]["usage"]["output_tokens"] > 0 and "gpu_seconds" in models[name]["cost"]
    assert batch.usage is not None
    assert sum(m["usage"]["total_tokens"] for m in models.values()) == batch.usage.total_tokens
    print("\ntwo-model batch:", batch.id, json.dumps(got), "\nnightbatch.models:", json.dumps(models))


def test_unknown_adapter_is_that_line_s_model_not_found(local_stack: LocalStack) -> None:
    client = local_stack.client()
    rows = [line(0, LORA_ADAPTER, PROMPTS[0]), line(1, "smollm2-no-such-lora", PROMPTS[1])]
    batch = wait(client, submit(client, rows, "/v1/chat/completions").id, timeout=120)
    assert batch.status == "failed" and batch.errors is not None and batch.errors.data is not None
    (error,) = batch.errors.data
    assert (error.code, error.line, error.param) == ("model_not_found", 2, "body.model")
    assert error.message is not None and LORA_ADAPTER in error.message
    print("\nunknown adapter:", error.model_dump_json())
