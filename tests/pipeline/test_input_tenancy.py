"""The GPU worker reads an input object only for the tenant it was stored for (files/inputs.py InputReader with the
shard's scope, nightbatch/tenancy/scope.py): a shard spec that names another tenant's input — a bug of ours, or a
spec tampered with — ends its lines `input_unreadable` and not a byte of the other tenant's input reaches the engine.
The same for an in-place object outside the tenant's allow-list entries."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from gpu_worker.runner import ShardJob, run_shard
from nightbatch import layout
from nightbatch.files.sources import InputSource
from nightbatch.pipeline import BatchTaskInput, plan_batch, validate_batch
from nightbatch.shards.spec import read_manifest, read_shard, write_shard
from nightbatch.wiring import Services
from tests.support.deterministic_engine import DeterministicEngine
from tests.support.pipeline_world import chat_line, jsonl, make_batch
from tests.worker.conftest import CHAT_MODEL

SECRET = "team-b-secret-prompt"


def _lines(prefix: str, text: str, n: int = 3) -> bytes:
    return jsonl([{**chat_line(i), "custom_id": f"{prefix}-{i}",
                   "body": {**chat_line(i)["body"], "messages": [{"role": "user", "content": f"{text} {i}"}]}}
                  for i in range(n)])


def _run(services: Services, batch_id: str) -> DeterministicEngine:
    spec = services.settings.serving.model(CHAT_MODEL)
    assert spec is not None
    engine = DeterministicEngine(spec)
    blobs = services.adapters.blobs
    for item in read_manifest(blobs, batch_id):
        asyncio.run(run_shard(ShardJob(batch_id=batch_id, shard_id=item.shard_id), engine=engine, blobs=blobs,
                              table=services.adapters.table, settings=services.settings))
    return engine


def _results(services: Services, batch_id: str) -> dict[str, dict[str, Any]]:
    blobs = services.adapters.blobs
    out: dict[str, dict[str, Any]] = {}
    for key in blobs.list_keys(layout.all_results_prefix(batch_id)):
        if layout.CHECKPOINT_RE.match(key.rsplit("/", 1)[-1]):
            for raw in (blobs.get_bytes(key) or b"").splitlines():
                line = json.loads(raw)
                out[line["custom_id"]] = line
    return out


def _validated(services: Services, tenant: str, payload: bytes) -> str:
    batch_id = make_batch(services, payload, tenant=tenant)
    assert validate_batch(BatchTaskInput(batch_id=batch_id), services).valid
    plan_batch(BatchTaskInput(batch_id=batch_id), services)
    return batch_id


def _point_shards_at(services: Services, batch_id: str, source: InputSource) -> None:
    blobs = services.adapters.blobs
    for item in read_manifest(blobs, batch_id):
        spec = read_shard(blobs, batch_id, item.shard_id)
        assert spec is not None and spec.tenant == "team-a"
        spec.input = source
        write_shard(blobs, spec)


def test_a_shard_pointed_at_another_tenants_input_reads_none_of_it(services: Services) -> None:
    theirs = _validated(services, "team-b", _lines("b", SECRET))
    mine = _validated(services, "team-a", _lines("a", "hello there friend!!"))  # the same size as B's
    blobs = services.adapters.blobs
    their_spec = read_shard(blobs, theirs, read_manifest(blobs, theirs)[0].shard_id)
    assert their_spec is not None and their_spec.input is not None
    _point_shards_at(services, mine, their_spec.input)
    engine = _run(services, mine)
    assert SECRET not in json.dumps([body for _, body in engine.received])
    results = _results(services, mine)
    assert sorted(results) == ["a-0", "a-1", "a-2"]
    for line in results.values():
        assert line["response"] is None and line["error"]["code"] == "input_unreadable"
        assert "team-a" in line["error"]["message"] and SECRET not in json.dumps(line)


def test_an_in_place_object_outside_the_tenants_entries_is_not_read(services: Services) -> None:
    s3 = services.adapters.client("s3")
    s3.create_bucket(Bucket="users-lake")
    s3.put_object(Bucket="users-lake", Key="teams/team-a/in.jsonl", Body=_lines("a", "hello there friend!!"))
    s3.put_object(Bucket="users-lake", Key="teams/team-b/in.jsonl", Body=_lines("b", SECRET))
    services.settings.files.user_input_buckets = "s3://users-lake/teams/{tenant}/"
    from nightbatch.batches.request import CreateBatchRequest
    batch = services.batches.create("team-a", CreateBatchRequest(
        endpoint="/v1/chat/completions", completion_window="24h",
        nightbatch={"input_uri": "s3://users-lake/teams/team-a/in.jsonl"}))
    assert validate_batch(BatchTaskInput(batch_id=batch.id), services).valid
    plan_batch(BatchTaskInput(batch_id=batch.id), services)
    spec = read_shard(services.adapters.blobs, batch.id, "00000")
    assert spec is not None and spec.input is not None
    part = spec.input.parts[0].model_copy(update={"key": "teams/team-b/in.jsonl", "etag": "", "version_id": ""})
    _point_shards_at(services, batch.id, spec.input.model_copy(update={"parts": [part]}))
    engine = _run(services, batch.id)
    assert SECRET not in json.dumps([body for _, body in engine.received])
    assert {line["error"]["code"] for line in _results(services, batch.id).values()} == {"input_unreadable"}
