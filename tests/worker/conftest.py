"""Worker fixtures: AWS in moto (in-process, or the session's loopback server for worker subprocesses), and
shards seeded in the storage format Validate and Plan write."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from moto import mock_aws

from gpu_worker.images import LineImages
from nightbatch.aws import Adapters, make_adapters
from nightbatch.aws.dynamo import create_table
from nightbatch.aws.records import BatchRecord
from nightbatch.ids import new_batch_id
from nightbatch.layout import CHECKPOINT_RE, done_key, results_prefix, shard_key
from nightbatch.local.aws import FAKE_CREDENTIALS
from nightbatch.settings import Settings, get_settings
from nightbatch.tenancy.scope import Scope
from tests.support.older_formats import segment_key, segment_line

CHAT_MODEL = "SmolLM2-135M-Instruct"
EMBED_MODEL = "all-MiniLM-L6-v2"
SHARD_ID = "00000"


def chat_requests(n: int, *, prefix: str = "req", max_tokens: int | None = 8) -> list[dict[str, Any]]:
    requests = []
    for i in range(n):
        message = {"role": "user", "content": f"question {i}"}
        body: dict[str, Any] = {"model": CHAT_MODEL, "messages": [message]}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        requests.append({"custom_id": f"{prefix}-{i:05d}", "body": body})
    return requests


@dataclass
class ShardWorld:
    """One batch with one shard in S3 and DynamoDB, and ways to read back what the worker wrote."""

    settings: Settings
    adapters: Adapters
    batch_id: str
    shard_id: str = SHARD_ID

    @property
    def prefix(self) -> str:
        return results_prefix(self.batch_id, self.shard_id)

    def put_batch(self, *, status: str = "in_progress", expires_in: float = 3600.0) -> None:
        self.adapters.table.put_record(BatchRecord(
            pk=self.batch_id, tenant="default", status=status, created_at=int(time.time()),
            endpoint="/v1/chat/completions", input_file_id="file-input", completion_window="24h",
            expires_at=int(time.time() + expires_in),
        ))

    def set_status(self, status: str) -> None:
        self.adapters.table.update(self.batch_id, set_={"status": status})

    def batch_item(self) -> dict[str, Any]:
        item = self.adapters.table.get(self.batch_id)
        assert item is not None
        return item

    def seed(
        self, requests: list[dict[str, Any]], *, endpoint: str = "/v1/chat/completions",
        model: str = CHAT_MODEL, per_segment: int = 50,
    ) -> list[str]:
        """Writes segments and the shard definition; returns the custom_ids in input order."""
        blobs = self.adapters.blobs
        segments: list[str] = []
        for start in range(0, len(requests), per_segment):
            key = segment_key(self.batch_id, len(segments))
            lines = [
                segment_line(start + i + 1, 20, json.dumps(
                    {"custom_id": r["custom_id"], "method": "POST", "url": endpoint, "body": r["body"]}).encode())
                for i, r in enumerate(requests[start:start + per_segment])
            ]
            blobs.put_bytes(key, b"".join(lines))
            segments.append(key)
        shard = {
            "version": 1, "batch_id": self.batch_id, "shard_id": self.shard_id, "endpoint": endpoint,
            "model": model, "segments": segments, "lines": len(requests), "est_tokens": 20 * len(requests),
        }
        blobs.put_bytes(shard_key(self.batch_id, self.shard_id), json.dumps(shard).encode())
        return [r["custom_id"] for r in requests]

    def checkpoint_keys(self) -> list[str]:
        keys = self.adapters.blobs.list_keys(self.prefix)
        return sorted(k for k in keys if CHECKPOINT_RE.match(k[len(self.prefix):]))

    def checkpoint_lines(self, key: str) -> list[dict[str, Any]]:
        raw = self.adapters.blobs.get_bytes(key)
        assert raw is not None and raw.endswith(b"\n")
        return [json.loads(line) for line in raw.decode().splitlines()]

    def results(self) -> tuple[dict[str, dict[str, Any]], int]:
        """Every result line across checkpoints, deduplicated as Finalize does (first in key order wins),
        and how many duplicates that dropped."""
        first: dict[str, dict[str, Any]] = {}
        duplicates = 0
        for key in self.checkpoint_keys():
            for line in self.checkpoint_lines(key):
                if line["custom_id"] in first:
                    duplicates += 1
                else:
                    first[line["custom_id"]] = line
        return first, duplicates

    def done_marker(self) -> dict[str, Any] | None:
        raw = self.adapters.blobs.get_bytes(done_key(self.batch_id, self.shard_id))
        return None if raw is None else dict(json.loads(raw))


def resolve_images(world: ShardWorld, body: dict[str, Any], *, endpoint: str = "/v1/chat/completions",
                   settings: Settings | None = None, tenant: str = "default") -> dict[str, Any]:
    """The body as the worker gives it to the engine (gpu_worker/images.py), for `tenant`'s shard."""
    settings = settings or world.settings
    images = LineImages(world.adapters.blobs, settings, Scope.of(settings, tenant))

    async def go() -> dict[str, Any]:
        async with images.resolved(endpoint, body) as ready:
            return ready

    return asyncio.run(go())


def _create_resources(adapters: Adapters) -> None:
    adapters.client("s3").create_bucket(Bucket=adapters.settings.deployment.bucket)
    create_table(adapters.client("dynamodb"), adapters.settings.deployment.table)


# Checkpoints of a few KB (a few lines each) rather than S3's 5 MiB part minimum: many of them in a short test.
WORKER_OVERRIDES: dict[str, Any] = {
    "checkpoint_every_lines": 10, "checkpoint_every_seconds": 0.25, "checkpoint_bytes": 4096, "max_in_flight": 8,
    "worker_poll_seconds": 0.1, "worker_drain_seconds": 5.0,
}


def worker_settings() -> Settings:
    return Settings.from_names({"bucket": "nb-worker-test", "table": "nb-worker-test", "region": "us-east-1",
                                **WORKER_OVERRIDES})


@pytest.fixture(scope="module")
def in_process_aws() -> Iterator[Adapters]:
    """AWS in this process (moto.mock_aws), shared by a module's tests; each test gets its own batch."""
    mp = pytest.MonkeyPatch()
    mp.delenv("AWS_ENDPOINT_URL", raising=False)
    for k, v in FAKE_CREDENTIALS.items():
        mp.setenv(k, v)
    try:
        with mock_aws():
            adapters = make_adapters(worker_settings())
            _create_resources(adapters)
            yield adapters
    finally:
        mp.undo()


@pytest.fixture
def world(in_process_aws: Adapters) -> ShardWorld:
    # The runner's boto3 calls from worker threads are served by the same mock.
    w = ShardWorld(settings=in_process_aws.settings, adapters=in_process_aws, batch_id=new_batch_id())
    w.put_batch()
    return w


@pytest.fixture
def served_world(fresh_aws: Callable[..., Adapters]) -> ShardWorld:
    """A shard on the session's moto server (tests/conftest.py), in a fresh bucket and table, for worker
    subprocesses: they reach it through AWS_ENDPOINT_URL."""
    adapters = fresh_aws(**WORKER_OVERRIDES)
    w = ShardWorld(settings=adapters.settings, adapters=adapters, batch_id=new_batch_id())
    w.put_batch()
    return w


@pytest.fixture
def env(world: ShardWorld, monkeypatch: pytest.MonkeyPatch) -> Iterator[ShardWorld]:
    """The environment `python -m gpu_worker` reads in a job, pointing at this world's shard."""
    s = world.settings.deployment
    for name, value in {
        "NIGHTBATCH_BUCKET": s.bucket, "NIGHTBATCH_TABLE": s.table, "NIGHTBATCH_REGION": s.region,
        "NIGHTBATCH_BATCH_ID": world.batch_id, "NIGHTBATCH_SHARD_ID": world.shard_id,
        "NIGHTBATCH_WORKER_POLL_SECONDS": "0.1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("NIGHTBATCH_WORKER_ENGINE", raising=False)
    get_settings.cache_clear()
    yield world
    get_settings.cache_clear()
