"""Typed records against moto: every stored kind round-trips, and get_owned hides other tenants' items."""

from __future__ import annotations

import pytest

from nightbatch.aws import Adapters
from nightbatch.aws.records import (
    KINDS,
    BatchRecord,
    DeliveryRecord,
    EventRecord,
    FileRecord,
    IdempotencyRecord,
    KeyRecord,
    RateCounter,
    Record,
    UploadRecord,
    UsageCounters,
    WebhookEndpointRecord,
)


def samples(tenant: str) -> list[Record]:
    return [
        FileRecord(pk=f"file-{tenant}1", tenant=tenant, created_at=100, bytes=3, filename="in.jsonl",
                   purpose="batch", s3_key="files/x", expires_at=200, parts=["a", "b"]),
        BatchRecord(pk=f"batch_{tenant}1", tenant=tenant, created_at=100, status="in_progress",
                    endpoint="/v1/chat/completions", input_file_id="file-1", completion_window="24h",
                    request_counts={"total": 2, "completed": 0, "failed": 0}, metadata={"a": "b"},
                    live_completed=1, est_tokens=42),
        UploadRecord(pk=f"upload_{tenant}1", tenant=tenant, created_at=100, bytes=10, filename="f",
                     mime_type="text/plain", purpose="batch", status="pending", expires_at=160, ttl=999),
        KeyRecord(pk=f"key#{tenant}hash", tenant=tenant, created_at=100, key_id=f"key_{tenant}", name="ci",
                  prefix="nb-abc"),
        WebhookEndpointRecord(pk=f"whep_{tenant}1", tenant=tenant, created_at=100, event_types=["batch.completed"],
                              name="n", url="https://example.com/h", secret="whsec_x"),
        DeliveryRecord(pk=f"wh_{tenant}1", tenant=tenant, created_at=100, endpoint_id=f"whep_{tenant}1",
                       event_id="evt_1", event_type="batch.completed", body="{}", status="pending",
                       attempts=[{"attempt": 1}], ttl=500),
        EventRecord(pk=EventRecord.pk_of(f"batch_{tenant}1", "completed"), tenant=tenant, event_id="evt_1",
                    type="batch.completed", batch_id=f"batch_{tenant}1", status="completed", created_at=100,
                    body="{}", open_status=EventRecord.PENDING, created_sk="100#evt_1", emailed_to=["a@b.c"]),
        IdempotencyRecord(pk=f"idem#{tenant}#k", tenant=tenant, fingerprint="f", state="done", token="t",
                          created_at=100, started_at=100, status=200, body="{}", headers={"x": "y"}),
        UsageCounters(pk=UsageCounters.pk_of(tenant), tenant=tenant, queued_requests=3, batches_in_flight=1,
                      **{"q#batch_1": {"requests": 3, "at": 100}}),
        RateCounter(pk=RateCounter.pk_of(tenant, 60), tenant=tenant, requests=7, ttl=180),
    ]


def test_every_kind_has_a_sample() -> None:
    assert {type(r) for r in samples("a")} == set(KINDS)


@pytest.mark.parametrize("index", range(len(KINDS)))
def test_every_kind_round_trips_through_its_record(adapters: Adapters, index: int) -> None:
    rec = samples("a")[index]
    adapters.table.put_record(rec, new=True)
    item = adapters.table.get(rec.pk)
    assert item is not None and item["kind"] == rec.KIND
    back = adapters.table.get_record(type(rec), rec.pk)
    assert back == rec
    assert back.to_item() == item  # index keys are derived, so written and re-derived agree
    # Another kind never reads it.
    others = [k for k in KINDS if k is not type(rec)]
    assert all(k.load(item) is None for k in others)


@pytest.mark.parametrize("index", range(len(KINDS)))
def test_get_owned_answers_another_tenants_id_like_a_missing_one(adapters: Adapters, index: int) -> None:
    mine, theirs = samples("a")[index], samples("b")[index]
    adapters.table.put_record(mine)
    adapters.table.put_record(theirs)
    kind = type(mine)
    assert adapters.table.get_owned(kind, "a", mine.pk) == mine
    assert adapters.table.get_owned(kind, "a", theirs.pk) is None
    assert adapters.table.get_owned(kind, "a", mine.pk + "-missing") is None
    assert adapters.table.get_owned(kind, "a", None) is None


def test_batch_leaves_the_open_index_when_terminal() -> None:
    rec = samples("a")[1]
    assert isinstance(rec, BatchRecord)
    assert rec.to_item()["open_status"] == "in_progress"
    rec.status = "completed"
    assert "open_status" not in rec.to_item()


def test_page_returns_up_to_limit_and_says_whether_more_follow(adapters: Adapters) -> None:
    for i in range(5):
        adapters.table.put_record(FileRecord(pk=f"file-{i}", tenant="a", created_at=100 + i, bytes=1,
                                             filename="f", purpose="batch" if i % 2 else "user_data", s3_key="k"))
    recs, more = adapters.table.page(FileRecord, "a#file", limit=2)
    assert [r.pk for r in recs] == ["file-4", "file-3"] and more
    recs, more = adapters.table.page(FileRecord, "a#file", limit=2, after_sk=recs[-1].owner_sk)
    assert [r.pk for r in recs] == ["file-2", "file-1"] and more
    recs, more = adapters.table.page(FileRecord, "a#file", limit=5, ascending=True,
                                     keep=lambda r: r.purpose == "batch")
    assert [r.pk for r in recs] == ["file-1", "file-3"] and not more


def test_update_record_refuses_an_attribute_its_kind_does_not_have(adapters: Adapters) -> None:
    rec = samples("a")[1]
    adapters.table.put_record(rec)
    with pytest.raises(ValueError, match="est_tokenz"):
        adapters.table.update_record(BatchRecord, rec.pk, set_={"est_tokenz": 1})
    assert adapters.table.update_record(BatchRecord, rec.pk, set_={"est_tokens": 7}).est_tokens == 7


def test_an_event_stays_on_the_open_index_until_closed(adapters: Adapters) -> None:
    event = next(r for r in samples("a") if isinstance(r, EventRecord))
    adapters.table.put_record(event, new=True)
    assert list(adapters.table.open_ids(EventRecord.PENDING)) == [event.pk]
    closed = adapters.table.update_record(EventRecord, event.pk, remove=("open_status", "created_sk"))
    assert not closed.pending and list(adapters.table.open_ids(EventRecord.PENDING)) == []
