"""The batch page's reads: shards, progress over time and notifications from the workers' records; previews."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import requests

from gpu_worker.checkpoints import MAX_SAMPLES, Checkpointer, CheckpointPolicy, thin
from gpu_worker.results import ResultLine
from nightbatch import layout
from nightbatch.aws.records import DeliveryRecord, EventRecord, WebhookEndpointRecord
from nightbatch.layout import progress_key
from nightbatch.notifications.delivery import delivery_id
from nightbatch.notifications.events import event_pk
from nightbatch.results.detail import progress_series
from nightbatch.shards.spec import ShardItem, ShardSpec, write_manifest, write_shard
from tests.dashboard.conftest import create_batch, put_file
from tests.support.lifecycle import drive

if TYPE_CHECKING:
    from tests.conftest import ApiServer


def get(api_server: ApiServer, path: str) -> requests.Response:
    return requests.get(api_server.v1 + path, headers=api_server.auth, timeout=10)


def result(i: int, ok: bool = True) -> ResultLine:
    return ResultLine(custom_id=f"r{i}", data=json.dumps({"custom_id": f"r{i}"}).encode() + b"\n", ok=ok,
                      input_tokens=3, output_tokens=7)


def test_the_checkpointer_leaves_cumulative_progress_samples(api_server: ApiServer) -> None:
    services = api_server.services
    batch_id = create_batch(services, 3)
    prefix = layout.results_prefix(batch_id, "00000")

    async def run() -> None:
        cp = Checkpointer(blobs=services.adapters.blobs, table=services.adapters.table, batch_id=batch_id,
                          prefix=prefix, attempt="a1", next_seq=0,
                          policy=CheckpointPolicy(first_lines=2, first_seconds=60, max_seconds=60))
        cp.start()
        cp.add(result(0))
        cp.add(result(1, ok=False))
        await asyncio.sleep(0.5)
        cp.add(result(2))
        await cp.close()

    asyncio.run(run())
    record = json.loads(services.adapters.blobs.get_bytes(progress_key(prefix, "a1")) or b"")
    assert record["attempt"] == "a1"
    assert [s[1:] for s in record["samples"]] == [[1, 1, 14], [2, 1, 21]]
    assert record["samples"][0][0] <= record["samples"][1][0]


def test_thinning_keeps_the_newest_sample() -> None:
    samples = [[float(i), i, 0, i] for i in range(MAX_SAMPLES + 1)]
    thinned = thin(samples)
    assert len(thinned) <= MAX_SAMPLES // 2 + 1
    assert thinned[-1] == samples[-1]


def test_attempts_merge_into_one_series_over_time() -> None:
    first = [[10.0, 2, 0, 20], [20.0, 5, 1, 50]]
    second = [[15.0, 1, 0, 9], [30.0, 4, 0, 40]]
    assert progress_series([first, second]) == [
        [10.0, 2, 0, 20], [15.0, 3, 0, 29], [20.0, 6, 1, 59], [30.0, 9, 1, 90]]


def test_detail_reports_shards_timings_progress_and_deliveries(api_server: ApiServer) -> None:
    services = api_server.services
    blobs, table = services.adapters.blobs, services.adapters.table
    batch_id = create_batch(services, 5)
    drive(services, batch_id, "in_progress", request_counts={"total": 5, "completed": 0, "failed": 0})
    blobs.put_bytes(layout.manifest_key(batch_id), json.dumps(
        [{"batch_id": batch_id, "shard_id": "00000"}, {"batch_id": batch_id, "shard_id": "00001"}]).encode())
    for sid, lines in (("00000", 3), ("00001", 2)):
        blobs.put_bytes(layout.shard_key(batch_id, sid), json.dumps(
            {"batch_id": batch_id, "shard_id": sid, "lines": lines, "est_tokens": 90}).encode())
    p0 = layout.results_prefix(batch_id, "00000")
    blobs.put_bytes(p0 + "000000-a1.jsonl", b"{}\n")
    blobs.put_bytes(p0 + "000001-b2.jsonl", b"{}\n")
    blobs.put_bytes(p0 + "acct-a1.json", json.dumps({
        "attempt": "a1", "model_load_seconds": 4.5, "inference_seconds": 1.0, "finished": False,
        "phases": {"container_start": 90.0, "weights_source": "s3", "weights_ready_s": 2.5,
                   "engine_ready_s": 4.0, "first_result_s": 9.0}}).encode())
    blobs.put_bytes(p0 + "progress-a1.json", json.dumps({"samples": [[100.0, 1, 0, 10]]}).encode())
    blobs.put_bytes(p0 + "progress-b2.json", json.dumps({"samples": [[110.0, 2, 0, 25]]}).encode())

    r = get(api_server, f"/nightbatch/batches/{batch_id}/detail")
    assert r.status_code == 200, r.text
    detail = r.json()
    assert detail["object"] == "nightbatch.batch_detail" and detail["shard_count"] == 2
    first, second = detail["shards"]
    assert (first["state"], first["lines"], first["checkpoints"]) == ("running", 3, 2)
    assert [a["attempt"] for a in first["attempts"]] == ["a1", "b2"]
    assert first["attempts"][0]["model_load_seconds"] == 4.5
    assert first["attempts"][0]["first_result_at"] == 100.0
    assert first["attempts"][0]["phases"]["engine_ready_s"] == 4.0
    assert first["attempts"][0]["phases"]["weights_source"] == "s3"
    assert (second["state"], second["attempts"]) == ("pending", [])
    assert detail["progress"]["points"] == [[100.0, 1, 0, 10], [110.0, 3, 0, 35]]
    assert detail["notifications"]["webhooks"] == []

    # Done: the shard's marker, and Notify's event with one webhook delivery and an e-mail.
    blobs.put_bytes(p0 + "_done.json", json.dumps({"lines": 3, "attempts": 2}).encode())
    drive(services, batch_id, "finalizing", "completed")
    table.put_record(EventRecord(pk=event_pk(batch_id, "completed"), tenant="default", event_id="evt_1",
                                 type="batch.completed", batch_id=batch_id, status="completed", created_at=123,
                                 body="{}", emailed_to=["ops@example.com"]))
    table.put_record(WebhookEndpointRecord(pk="whep_1", tenant="default", created_at=1, event_types=[],
                                           name="hook", url="https://example.com/hook", secret="whsec_x"))
    table.put_record(DeliveryRecord(
        pk=delivery_id("evt_1", "whep_1"), tenant="default", endpoint_id="whep_1", event_id="evt_1",
        event_type="batch.completed", batch_id=batch_id, body="{}", status="succeeded", created_at=124,
        attempts=[{"attempt": 1, "attempted_at": 125, "status_code": 200, "duration_ms": 12}]))
    detail = get(api_server, f"/nightbatch/batches/{batch_id}/detail").json()
    assert [s["state"] for s in detail["shards"]] == ["completed", "not_started"]
    notes: dict[str, Any] = detail["notifications"]
    assert notes["event"] == {"id": "evt_1", "type": "batch.completed", "created_at": 123}
    assert notes["emails"] == [{"to": "ops@example.com", "status": "sent"}]
    assert [(w["status"], w["url"], len(w["attempts"])) for w in notes["webhooks"]] == [
        ("succeeded", "https://example.com/hook", 1)]


def test_detail_is_tenant_scoped(api_server: ApiServer) -> None:
    r = get(api_server, "/nightbatch/batches/batch_doesnotexist/detail")
    assert r.status_code == 404
    assert requests.get(api_server.v1 + "/nightbatch/batches/x/detail", timeout=10).status_code == 401


def test_preview_reads_the_first_lines_only(api_server: ApiServer) -> None:
    services = api_server.services
    lines = [json.dumps({"custom_id": f"r{i}", "response": {"body": {"text": "x" * 100}}}) for i in range(500)]
    data = ("\n".join(lines) + "\n").encode()
    put_file(services, "file-previewMe0000000000000", data, "out.jsonl")
    r = get(api_server, "/nightbatch/files/file-previewMe0000000000000/preview?lines=3")
    assert r.status_code == 200, r.text
    body = r.json()
    assert [x["line"] for x in body["lines"]] == [1, 2, 3]
    assert body["lines"][2]["json"]["custom_id"] == "r2"
    assert body["has_more"] is True
    assert body["bytes"] == len(data)

    # One line longer than the read bound: its start, marked as cut.
    put_file(services, "file-previewHuge000000000000", b'{"a": "' + b"y" * 400_000 + b'"}\n', "big.jsonl")
    huge = get(api_server, "/nightbatch/files/file-previewHuge000000000000/preview").json()
    assert huge["lines"][0]["truncated"] is True
    assert huge["lines"][0]["json"] is None
    assert len(huge["lines"][0]["text"]) <= 300_000

    assert get(api_server, "/nightbatch/files/file-previewMe0000000000000/preview?lines=0").status_code == 400
    assert get(api_server, "/nightbatch/files/file-nope000000000000000000/preview").status_code == 404


def test_results_preview_of_a_running_batch(api_server: ApiServer) -> None:
    services = api_server.services
    batch_id = create_batch(services, 3)
    write_manifest(services.adapters.blobs, batch_id, [ShardItem(batch_id=batch_id, shard_id="00000")])
    write_shard(services.adapters.blobs, ShardSpec(
        batch_id=batch_id, shard_id="00000", endpoint="/v1/chat/completions", model="m", segments=[], lines=3))
    drive(services, batch_id, "in_progress", request_counts={"total": 3, "completed": 0, "failed": 0},
          live_completed=2, live_failed=1)
    lines = [json.dumps({"custom_id": f"r{i}", "response": {"status_code": 200 if i else 400, "body": {}}})
             for i in range(3)]
    services.adapters.blobs.put_bytes(layout.checkpoint_key(layout.results_prefix(batch_id, "00000"), 0, "a"),
                                      ("\n".join(lines) + "\n").encode())
    body = get(api_server, f"/nightbatch/batches/{batch_id}/preview?lines=1").json()
    assert (body["complete"], body["count"], body["status"]) == (False, 2, "in_progress")
    assert body["lines"] == [{"line": 1, "json": json.loads(lines[1])}]
    errors = get(api_server, f"/nightbatch/batches/{batch_id}/preview?kind=error").json()
    assert [x["json"]["custom_id"] for x in errors["lines"]] == ["r0"]
    assert get(api_server, f"/nightbatch/batches/{batch_id}/preview?lines=99").status_code == 400
    assert get(api_server, "/nightbatch/batches/batch_nope/preview").status_code == 404
