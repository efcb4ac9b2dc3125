"""A Finalize that raises on a batch's data (not on AWS) is retried, then fails the batch saying why and gives
back the tenant's slot: one batch it cannot finish never stays `finalizing` for good (the sweeper would call
it forever and the tenant's in-flight slot would stay taken)."""

from __future__ import annotations

import pytest

from nightbatch import layout
from nightbatch.pipeline import BatchTaskInput, finalize_batch, plan_batch, validate_batch
from nightbatch.pipeline.finalize import FINALIZE_ATTEMPTS
from nightbatch.shards.spec import read_manifest
from nightbatch.tenancy.limits import read_usage
from nightbatch.wiring import Services
from tests.support.pipeline_world import chat_line, jsonl, make_batch


def test_finalize_fails_the_batch_with_its_reason_after_its_attempts(services: Services) -> None:
    batch_id = make_batch(services, jsonl([chat_line(i) for i in range(3)]))
    inp = BatchTaskInput(batch_id=batch_id)
    assert validate_batch(inp, services).valid
    plan_batch(inp, services)
    table, blobs = services.adapters.table, services.adapters.blobs
    assert read_usage(table, "default").queued_requests == 3
    [item] = read_manifest(blobs, batch_id)
    blobs.put_bytes(layout.shard_key(batch_id, item.shard_id), b'{"not": "a shard"}')  # unreadable data
    for _ in range(FINALIZE_ATTEMPTS - 1):
        with pytest.raises(ValueError):
            finalize_batch(inp, services)  # the workflow's retries (then the sweeper) run it again
        assert services.batches.get("default", batch_id).status == "finalizing"
    assert finalize_batch(inp, services).status == "failed"
    batch = services.batches.get("default", batch_id)
    assert batch.status == "failed" and batch.errors is not None
    [error] = batch.errors.data
    assert error.code == "finalize_failed" and "ValidationError" in error.message
    assert read_usage(table, "default").queued_requests == 0  # its queued requests given back
    assert finalize_batch(inp, services).status == "failed"  # idempotent from here
