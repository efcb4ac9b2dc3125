"""Schemathesis with two keys: tenant A fuzzes the API (generated cases, and cases aimed at tenant B's ids).

No 5xx, no internals in any error, B's ids and names never appear in A's answers, and B's ids always get the
answer an unknown id gets. 150 generated cases by default, derandomized; FUZZ_EXAMPLES=N runs N random ones.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from tests.support.tenant_stack import Stack, chat_lines, fresh_adapters, start_stack, stop_stack

INTERNALS = re.compile(r"Traceback|File \"|\.py\b|botocore|boto3|ResourceNotFound|nightbatch\.|"
                       r"functions\.api|moto\b", re.IGNORECASE)
B_NAME = "tenant-b-private-name.jsonl"
B_META = "tenant-b-private-metadata"


@dataclass
class Fuzz:
    stack: Stack
    key_a: str
    key_b: str
    b_ids: list[str]
    a_ids: dict[str, str]
    schema: Any


@pytest.fixture(scope="module")
def fuzz(moto_endpoint: str) -> Iterator[Fuzz]:
    # No rate limit here: the fuzzer sends hundreds of requests a minute on purpose.
    stack = start_stack(fresh_adapters(moto_endpoint, limit_requests_per_minute=0))
    key_a = stack.new_key("team-a", "fuzzer")
    key_b = stack.new_key("team-b", "victim")
    a, b = stack.client(key_a), stack.client(key_b)
    fb = b.files.create(file=(B_NAME, chat_lines(2)), purpose="batch")
    bb = b.batches.create(input_file_id=fb.id, endpoint="/v1/chat/completions", completion_window="24h",
                          metadata={"owner": B_META})
    fa = a.files.create(file=("a.jsonl", chat_lines(2)), purpose="batch")
    ba = a.batches.create(input_file_id=fa.id, endpoint="/v1/chat/completions", completion_window="24h")
    spec = httpx.get(stack.base_url.removesuffix("/v1") + "/openapi.json").json()
    schema = schemathesis.openapi.from_dict(spec)
    yield Fuzz(stack, key_a, key_b, [fb.id, bb.id], {"file_id": fa.id, "batch_id": ba.id}, schema)
    stop_stack(stack)
    stack.services.adapters.client("dynamodb").delete_table(TableName=stack.settings.deployment.table)


def check(fz: Fuzz, case: Any) -> httpx.Response | Any:
    base = fz.stack.base_url.removesuffix("/v1")
    response = case.call(base_url=base, headers={"Authorization": f"Bearer {fz.key_a}"})
    text = response.text
    where = f"{case.method} {case.formatted_path}"
    assert response.status_code < 500, f"{where}: {response.status_code} {text[:500]}"
    if response.status_code >= 400:
        assert not INTERNALS.search(text), f"{where}: internals in {text[:500]}"
    sent = f"{case.formatted_path} {case.query} {case.body}"
    for secret in (*fz.b_ids, B_NAME, B_META):
        # An error may echo an id the caller sent; anything else of B's is a leak.
        assert secret in sent or secret not in text, f"{where}: leaked {secret}"
    return response


EXAMPLES = os.environ.get("FUZZ_EXAMPLES")
FUZZ_SETTINGS = settings(max_examples=int(EXAMPLES or 150), deadline=None, database=None,
                         derandomize=EXAMPLES is None, suppress_health_check=list(HealthCheck))


def test_generated_requests_as_tenant_a(fuzz: Fuzz) -> None:
    strategy = st.one_of(fuzz.schema.as_strategy(GenerationMode.POSITIVE),
                         fuzz.schema.as_strategy(GenerationMode.NEGATIVE))

    @FUZZ_SETTINGS
    @given(case=strategy)
    def run(case: Any) -> None:
        check(fuzz, case)

    run()


def test_tenant_b_ids_look_unknown_to_tenant_a(fuzz: Fuzz) -> None:
    b_file, b_batch = fuzz.b_ids
    ids = {"file_id": b_file, "batch_id": b_batch}
    unknown = {"file_id": "file-AAAAAAAAAAAAAAAAAAAAAAAA", "batch_id": "batch_" + "0" * 32}
    probed = 0
    for result in fuzz.schema.get_all_operations():
        op = result.ok()
        params = {p for p in ("file_id", "batch_id") if "{" + p + "}" in op.path}
        if params:
            probe_operation(fuzz, op, {p: ids[p] for p in params}, {p: unknown[p] for p in params})
            probed += 1
    assert probed >= 5  # retrieve/delete/content of files, retrieve/cancel of batches
    # B's objects are untouched by everything A sent.
    b = fuzz.stack.client(fuzz.key_b)
    assert b.files.retrieve(b_file).filename == B_NAME
    assert b.batches.retrieve(b_batch).status == "validating"


def _fresh_idempotency_key(case: Any) -> None:
    """Generated keys repeat across examples, and a key reused on another request is a 409 whatever the id: each
    call gets its own (tests/tenancy/test_idempotency.py covers the keys themselves)."""
    if case.headers and "Idempotency-Key" in case.headers:
        case.headers = {**case.headers, "Idempotency-Key": uuid.uuid4().hex}


def probe_operation(fuzz: Fuzz, op: Any, theirs: dict[str, str], unknown: dict[str, str]) -> None:
    """Cases for one operation aimed at B's ids; each answer must equal the answer for an unknown id."""
    base = fuzz.stack.base_url.removesuffix("/v1")

    @settings(max_examples=10, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy(path_parameters=theirs))
    def run(case: Any) -> None:
        _fresh_idempotency_key(case)
        response = check(fuzz, case)
        case.path_parameters = {**case.path_parameters, **unknown}
        _fresh_idempotency_key(case)
        twin = case.call(base_url=base, headers={"Authorization": f"Bearer {fuzz.key_a}"})
        assert response.status_code == twin.status_code, f"{case.method} {op.path}"
        if response.status_code >= 400:
            mine, other = response.json()["error"], twin.json()["error"]
            for p in theirs:
                mine["message"] = mine["message"].replace(theirs[p], "<id>")
                other["message"] = other["message"].replace(unknown[p], "<id>")
            assert mine == other, f"{case.method} {op.path}"

    run()
