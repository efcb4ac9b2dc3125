"""M1: the `nightbatch` options are allow-listed and small; a batch whose item outgrew DynamoDB's 400 KB limit
is failed for good with a clear error; the sweeper isolates each batch, so one bad item stalls nobody else."""

from __future__ import annotations

import pytest

from nightbatch.errors import InvalidRequestError, StorageItemTooLargeError
from nightbatch.pipeline import BatchTaskInput, finalize_batch, validate_batch
from nightbatch.pipeline.sweep import sweep
from nightbatch.wiring import Services
from tests.support.pipeline_world import chat_line, jsonl, make_batch


@pytest.mark.parametrize(("options", "param", "code"), [
    ({"evil": "x"}, "nightbatch.evil", "unknown_parameter"),
    ({"notify": {"email": "a@example.com", "pad": "x"}}, "nightbatch.notify.pad", "unknown_parameter"),
    ({"notify": "a@example.com"}, "nightbatch.notify", "invalid_type"),
    ({"notify": {"email": ["a" * 60 + f"{i}@example.com" for i in range(9)] + ["x" * 4000]}}, "nightbatch",
     "invalid_value"),
])
def test_unknown_or_oversized_options_are_a_400(services: Services, options: dict, param: str,
                                                code: str) -> None:
    with pytest.raises(InvalidRequestError) as e:
        make_batch(services, jsonl([chat_line(1)]), nightbatch=options)
    assert (e.value.status, e.value.param, e.value.code) == (400, param, code)


def test_known_small_options_are_stored(services: Services) -> None:
    batch_id = make_batch(services, jsonl([chat_line(1)]), nightbatch={"notify": {"email": "a@example.com"}})
    assert services.adapters.table.get(batch_id)["options"] == {"notify": {"email": "a@example.com"}}


def _bloat(services: Services, batch_id: str) -> None:
    """As a batch stored before the cap could be: options filling the item to DynamoDB's limit."""
    for size in range(412_000, 390_000, -25):  # within 25 bytes of the limit: the next transition overflows
        try:
            services.adapters.table.update(batch_id, set_={"options": {"notify": {"email": "x" * size}}})
            return
        except StorageItemTooLargeError:
            continue
    raise AssertionError("could not fill the item")


def test_a_batch_whose_item_outgrew_the_limit_is_failed_with_a_clear_error(services: Services) -> None:
    batch_id = make_batch(services, jsonl([chat_line(1), chat_line(2)]))
    validate_batch(BatchTaskInput(batch_id=batch_id), services)
    _bloat(services, batch_id)
    out = finalize_batch(BatchTaskInput(batch_id=batch_id), services)
    assert out.status == "failed"
    batch = services.batches.get("default", batch_id)
    assert batch.status == "failed" and batch.failed_at
    assert batch.errors is not None and batch.errors.data[0].code == "batch_item_too_large"
    assert "400 KB" in batch.errors.data[0].message
    assert "options" not in services.adapters.table.get(batch_id)
    assert finalize_batch(BatchTaskInput(batch_id=batch_id), services).status == "failed"  # idempotent


def test_the_sweeper_skips_a_bad_batch_and_handles_the_rest(services: Services) -> None:
    corrupt = make_batch(services, jsonl([chat_line(1)]))
    services.adapters.table.update(corrupt, remove=("expires_at",))  # a KeyError for this batch only
    oversized = make_batch(services, jsonl([chat_line(1)]))
    validate_batch(BatchTaskInput(batch_id=oversized), services)
    services.adapters.table.update(oversized, set_={"expires_at": 1})
    _bloat(services, oversized)
    stale = make_batch(services, jsonl([chat_line(2)]))
    report = sweep(services, stale_seconds=-1)
    assert report["skipped"] == [corrupt]
    assert stale in report["redriven"]
    assert report["finalized"] == [oversized]
    assert services.batches.get("default", oversized).status == "failed"
