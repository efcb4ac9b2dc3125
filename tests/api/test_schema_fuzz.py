"""Schemathesis against the app's own OpenAPI schema, over real HTTP: no generated request produces a 5xx,
and every failure is OpenAI's error envelope (Anthropic's on /v1/messages/…) with an x-request-id.

schemathesis' pytest plugin (`schemathesis.pytest.from_fixture`) does not run under pytest 9, so each
operation's hypothesis strategy is driven directly; valid and invalid (negative) inputs are both generated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from functions.api.app import create_app

if TYPE_CHECKING:
    from tests.conftest import ApiServer

# Bounded so the module stays under a minute on 2 cores (~20 operations x 2 key states).
EXAMPLES = 15
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)

# Routes authenticated by a signature in the URL rather than the bearer key (a bad one is 403).
SIGNED_NOT_KEYED = {"GET /v1/nightbatch/files/{file_id}/download"}

# The schema of the app as built (services are lazy, so building it touches no AWS).
SCHEMA = schemathesis.openapi.from_dict(create_app().openapi())
OPERATIONS = [result.ok() for result in SCHEMA.get_all_operations()]


def check(resp: Any) -> None:
    assert resp.status_code < 500, f"{resp.status_code} {resp.request.method} {resp.request.url}: {resp.text}"
    # schemathesis' Response keeps every header as a list of values.
    assert resp.headers.get("x-request-id", [""])[0].startswith("req_")
    if resp.status_code >= 400:
        body = resp.json()
        if resp.request.path_url.startswith("/v1/messages/"):  # the Anthropic wire's envelope (docs/ANTHROPIC.md)
            assert set(body) == {"type", "error", "request_id"} and body["type"] == "error", body
            assert set(body["error"]) == {"type", "message"}, body
            return
        assert set(body) == {"error"}, body
        assert set(body["error"]) == {"message", "type", "param", "code"}, body


def test_the_schema_covers_every_route() -> None:
    labels = {op.label for op in OPERATIONS}
    assert {"POST /v1/files", "GET /v1/files", "GET /v1/files/{file_id}", "DELETE /v1/files/{file_id}",
            "GET /v1/files/{file_id}/content", "POST /v1/batches", "GET /v1/batches",
            "GET /v1/batches/{batch_id}", "POST /v1/batches/{batch_id}/cancel", "GET /v1/models"} <= labels


@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda op: op.label)
@pytest.mark.parametrize("valid_key", [True, False], ids=["valid-key", "wrong-key"])
def test_no_5xx_for_generated_requests(api_server: ApiServer, operation: Any, valid_key: bool) -> None:
    auth = api_server.auth if valid_key else {"Authorization": "Bearer not-the-key"}
    auth = {**auth, "anthropic-version": "2023-06-01"}  # what the Anthropic wire also asks of every request
    strategy = operation.as_strategy(GenerationMode.POSITIVE) | operation.as_strategy(GenerationMode.NEGATIVE)

    @FUZZ
    @given(case=strategy)
    def fuzz(case: Any) -> None:
        resp = case.call(base_url=api_server.base_url, headers=auth, timeout=30)
        check(resp)
        if not valid_key:
            assert 400 <= resp.status_code < 500, resp.text
            if operation.label not in SIGNED_NOT_KEYED:
                assert resp.status_code in (400, 401, 404, 405, 413), resp.text

    fuzz()
