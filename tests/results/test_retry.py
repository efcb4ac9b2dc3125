# ruff: noqa: F811  (the `services` fixture is imported from tests/support/pipeline_world.py, then requested)
"""Retry (nightbatch/results/retry.py): a new batch of some lines of an ended one, from the original input bytes."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from nightbatch.errors import ConflictError, InvalidRequestError, NotFoundError
from nightbatch.pipeline import BatchTaskInput, finalize_batch
from nightbatch.results.retry import RetryRequest, retry_batch
from nightbatch.wiring import Services
from tests.pipeline.test_pipeline import read_file, run_to_shards, write_results
from tests.support.pipeline_world import (
    chat_line,
    jsonl,
    make_batch,
    services,  # noqa: F401  (the pipeline's world on moto)
)

TENANT = "default"


def input_bytes(services: Services, batch_id: str) -> bytes:
    item = services.files.item(TENANT, services.batches.item(TENANT, batch_id).input_file_id)
    return b"".join(services.files.chunks(item))


def cancelled_half_way(services: Services, n: int = 10, **kw: object) -> tuple[str, bytes]:
    payload = jsonl([chat_line(i, temperature=0.5) for i in range(1, n + 1)])
    batch_id = make_batch(services, payload, **kw)  # type: ignore[arg-type]
    shards = run_to_shards(services, batch_id)
    write_results(services, batch_id, shards[0], skip={f"req-{i}" for i in range(n // 2 + 1, n + 1)})
    services.batches.cancel(TENANT, batch_id)
    finalize_batch(BatchTaskInput(batch_id=batch_id), services)
    return batch_id, payload


def test_cancel_then_retry_covers_every_line_exactly_once(services: Services) -> None:
    batch_id, payload = cancelled_half_way(services, metadata={"team": "eval"},
                                           nightbatch={"notify": {"email": ["me@example.com"]}})
    old = services.batches.get(TENANT, batch_id)
    assert old.status == "cancelled" and old.request_counts.failed == 5

    new = retry_batch(services, TENANT, batch_id, RetryRequest())
    assert new.nightbatch == {"retry_of": batch_id, "retry_lines": 5}
    assert (new.endpoint, new.completion_window, new.metadata) == (old.endpoint, "24h", {"team": "eval"})
    assert services.batches.item(TENANT, new.id).options == {"notify": {"email": ["me@example.com"]}}
    assert services.batches.get(TENANT, batch_id).nightbatch["retried_by"] == [new.id]  # type: ignore[index]
    # The original bytes of exactly the unrun lines, in input order.
    assert input_bytes(services, new.id) == b"".join(payload.splitlines(keepends=True)[5:])

    for shard in run_to_shards(services, new.id):
        write_results(services, new.id, shard)
    finalize_batch(BatchTaskInput(batch_id=new.id), services)
    done = services.batches.get(TENANT, new.id)
    assert done.status == "completed" and done.request_counts.completed == 5
    union = Counter(x["custom_id"] for b in (old, done) for x in read_file(services, b.output_file_id))
    assert union == Counter(f"req-{i}" for i in range(1, 11))


def test_custom_ids_and_overrides(services: Services) -> None:
    batch_id, _ = cancelled_half_way(services)
    new = retry_batch(services, TENANT, batch_id, RetryRequest(
        custom_ids=["req-2", "req-9"], completion_window="48h", metadata={"try": "2"}))
    assert (new.completion_window, new.metadata) == ("48h", {"try": "2"})
    assert [json.loads(x)["custom_id"] for x in input_bytes(services, new.id).splitlines()] == ["req-2", "req-9"]
    again = retry_batch(services, TENANT, batch_id, RetryRequest(error_codes=["batch_cancelled"]))
    assert services.batches.get(TENANT, batch_id).nightbatch["retried_by"] == [new.id, again.id]  # type: ignore[index]


def test_refusals(services: Services) -> None:
    running = make_batch(services, jsonl([chat_line(1)]))
    with pytest.raises(ConflictError) as conflict:
        retry_batch(services, TENANT, running, RetryRequest())
    assert conflict.value.code == "batch_not_ended"
    with pytest.raises(NotFoundError):
        retry_batch(services, "other", running, RetryRequest())

    batch_id, _ = cancelled_half_way(services)
    with pytest.raises(InvalidRequestError) as none:
        retry_batch(services, TENANT, batch_id, RetryRequest(error_codes=["shard_failed"]))
    assert none.value.code == "no_matching_lines" and none.value.status == 400
    with pytest.raises(InvalidRequestError) as unknown:
        retry_batch(services, TENANT, batch_id, RetryRequest(custom_ids=["req-1", "nope"]))
    assert "'nope'" in unknown.value.message and unknown.value.param == "custom_ids"
    with pytest.raises(InvalidRequestError):
        retry_batch(services, TENANT, batch_id, RetryRequest(custom_ids=["req-1"], error_codes=["x"]))
    files_before = services.files.list(TENANT, purpose="batch", limit=100, order="asc", after=None).data

    services.files.delete(TENANT, services.batches.item(TENANT, batch_id).input_file_id)
    with pytest.raises(ConflictError) as gone:
        retry_batch(services, TENANT, batch_id, RetryRequest())
    assert gone.value.code == "input_file_gone" and gone.value.status == 409
    # Refused retries leave no input file behind.
    after = services.files.list(TENANT, purpose="batch", limit=100, order="asc", after=None).data
    assert len(after) == len(files_before) - 1
