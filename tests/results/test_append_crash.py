"""An attempt's last lines appended to its previous checkpoint (gpu_worker.checkpoints, BlobStore.append), with the
worker killed in the middle: between the upload's parts (the multipart upload has both parts and is never
completed: the checkpoint is as it was, the last lines not durable) or after it completed but before the new
summary was written (the summary describes the old object). In both, the partial results serve exactly what
is durable, a restarted attempt runs what is not, and Finalize ends every line exactly once."""

from __future__ import annotations

import json

import pytest

from gpu_worker.checkpoints import Checkpointer, CheckpointPolicy
from gpu_worker.shard import read_progress
from nightbatch import layout
from nightbatch.ids import custom_id_digest
from nightbatch.pipeline import BatchTaskInput, finalize_batch
from nightbatch.results.compose import MIN_PART_BYTES
from nightbatch.results.partial import partial_results
from nightbatch.wiring import Services
from tests.results.test_input_order import answer
from tests.support.pipeline_world import planned_shards, shard_requests_of


def writer(services: Services, batch_id: str, shard_id: str, attempt: str, seq: int) -> Checkpointer:
    return Checkpointer(blobs=services.adapters.blobs, table=services.adapters.table, batch_id=batch_id,
                        prefix=layout.results_prefix(batch_id, shard_id), attempt=attempt, next_seq=seq,
                        policy=CheckpointPolicy())


def shown(services: Services, batch_id: str, kind: str = "output") -> list[bytes]:
    return list(partial_results(services, "default", batch_id, kind).lines)


@pytest.mark.parametrize("killed", ["between_parts", "before_summary"])
def test_a_kill_while_appending_the_last_lines_loses_and_duplicates_nothing(services: Services, killed: str) -> None:
    batch_id, [(shard_id, ids)] = planned_shards(services, 100, segment_max_lines=1000, shard_target_tokens=10**9)
    reqs = shard_requests_of(services, batch_id, shard_id)
    blobs, client = services.adapters.blobs, services.adapters.blobs.client
    first = writer(services, batch_id, shard_id, "a", 0)
    first.write([answer(batch_id, r.custom_id, r.number, "q" * 100_000) for r in reqs[:60]])  # 6 MB
    [key] = list(blobs.list_keys(layout.results_prefix(batch_id, shard_id)))[:1]
    before = shown(services, batch_id)
    tail = b"".join(answer(batch_id, r.custom_id, r.number, "").data for r in reqs[60:])
    assert blobs.size(key) >= MIN_PART_BYTES > len(tail)

    # What the kill leaves: the parts of BlobStore.append sent, the upload never completed ...
    common = {"Bucket": blobs.bucket, "Key": key}
    upload = client.create_multipart_upload(**common)["UploadId"]
    whole = f"bytes=0-{(blobs.size(key) or 0) - 1}"
    parts = [client.upload_part_copy(CopySource=common, CopySourceRange=whole, PartNumber=1, UploadId=upload,
                                     **common)[
        "CopyPartResult"]["ETag"], client.upload_part(Body=tail, PartNumber=2, UploadId=upload, **common)["ETag"]]
    if killed == "before_summary":  # ... or completed, the summary not yet rewritten
        client.complete_multipart_upload(UploadId=upload, MultipartUpload={"Parts": [
            {"ETag": e, "PartNumber": n} for n, e in enumerate(parts, 1)]}, **common)
    now = shown(services, batch_id)
    durable = len(now) + len(shown(services, batch_id, "error"))
    assert now[:len(before)] == before and durable == (60 if killed == "between_parts" else 100)

    # The restarted attempt runs what is not durable, as the worker's resume reads it.
    progress = read_progress(blobs, layout.results_prefix(batch_id, shard_id))
    rest = [r for r in reqs if custom_id_digest(r.custom_id) not in progress.done]
    assert progress.next_seq == 1 and len(progress.done) == durable == 100 - len(rest)
    if rest:
        writer(services, batch_id, shard_id, "b", progress.next_seq).write(
            [answer(batch_id, r.custom_id, r.number, "") for r in rest], last=True)
    blobs.put_bytes(layout.done_key(batch_id, shard_id), b"{}")
    services.adapters.table.update(batch_id, set_={"status": "finalizing", "finalize_target": "completed"})
    assert finalize_batch(BatchTaskInput(batch_id=batch_id), services).status == "completed"
    out = (blobs.get_bytes(layout.output_key(batch_id)) or b"").splitlines(keepends=True)
    err = (blobs.get_bytes(layout.error_key(batch_id)) or b"").splitlines(keepends=True)
    ended = [json.loads(x)["custom_id"] for x in out + err]
    assert sorted(ended) == sorted(ids) and set(now) <= set(out)
