"""Tenant B's image file named on tenant A's line after Validate, through the real Validate, Plan and worker (the
deterministic engine): A's input object is rewritten in place (same size, same tags) to name B's file, validated for
B's own batch. Whatever catches it (the worker's check of the file's tenant tag, gpu_worker/images.py; the input's
pinning), B's bytes never reach the engine running A's shard."""

from __future__ import annotations

import asyncio
import base64
import io

from gpu_worker.runner import ShardJob, run_shard
from nightbatch.layout import file_key
from nightbatch.pipeline import BatchTaskInput, plan_batch, validate_batch
from nightbatch.shards.spec import read_manifest
from nightbatch.wiring import Services
from tests.support.deterministic_engine import DeterministicEngine
from tests.support.pipeline_world import jsonl, make_batch
from tests.worker.conftest import CHAT_MODEL
from tests.worker.test_file_images import PNG, file_line
from tests.worker.test_image_tenancy import THEIRS, put_tagged, sent


def test_a_line_rewritten_after_validate_to_name_another_tenants_file(services: Services) -> None:
    def image(tenant: str, data: bytes) -> str:
        return services.files.create(tenant, filename="x.png", purpose="vision", fileobj=io.BytesIO(data),
                                     size=len(data)).id

    mine, theirs = image("team-a", PNG), image("team-b", THEIRS)
    for tenant, file_id in (("team-b", theirs), ("team-a", mine)):
        line = dict(file_line("look", file_id), method="POST", url="/v1/chat/completions")
        batch_id = make_batch(services, jsonl([line]), tenant=tenant)
        assert validate_batch(BatchTaskInput(batch_id=batch_id), services).valid
    plan_batch(BatchTaskInput(batch_id=batch_id), services)
    blobs = services.adapters.blobs
    key = file_key(services.batches.get("team-a", batch_id).input_file_id)
    data = blobs.get_bytes(key)
    assert data is not None and mine.encode() in data and len(mine) == len(theirs)
    put_tagged(blobs, key, data.replace(mine.encode(), theirs.encode()), blobs.tags(key))
    spec = services.settings.serving.model(CHAT_MODEL)
    assert spec is not None
    engine = DeterministicEngine(spec)
    for item in read_manifest(blobs, batch_id):
        asyncio.run(run_shard(ShardJob(batch_id=batch_id, shard_id=item.shard_id), engine=engine, blobs=blobs,
                              table=services.adapters.table, settings=services.settings))
    assert base64.b64encode(THEIRS).decode() not in sent(engine)
