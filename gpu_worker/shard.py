"""A shard in S3: its definition, its lines streamed in order (nightbatch/pipeline/shard_lines.py), the results
already checkpointed."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gpu_worker.results import usage_tokens
from nightbatch import layout
from nightbatch.layout import CHECKPOINT_RE, ShardSpec
from nightbatch.pipeline.shard_lines import shard_requests
from nightbatch.storage import BlobStore

log = logging.getLogger("gpu_worker.shard")

@dataclass(frozen=True)
class PendingRequest:
    """One line of the shard still to run."""

    n: int
    custom_id: str
    body: dict[str, Any]


@dataclass
class Progress:
    """What earlier attempts left in S3: finished custom_ids (this shard only: bounded), the next seq."""

    done_ids: set[str] = field(default_factory=set)
    next_seq: int = 0
    attempts: set[str] = field(default_factory=set)
    checkpoints: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


def load_shard(blobs: BlobStore, batch_id: str, shard_id: str) -> ShardSpec:
    spec = layout.read_shard(blobs, batch_id, shard_id)
    if spec is None:
        key = layout.shard_key(batch_id, shard_id)
        raise FileNotFoundError(f"shard definition s3://{blobs.bucket}/{key} does not exist")
    return spec


def iter_object_lines(blobs: BlobStore, key: str) -> Iterator[bytes]:
    """The non-blank lines of one object, streamed in chunks (never the whole object in memory)."""
    tail = b""
    for chunk in blobs.iter_chunks(key):
        parts = (tail + chunk).split(b"\n")
        tail = parts.pop()
        for line in parts:
            if line.strip():
                yield line
    if tail.strip():
        yield tail


class PendingLines:
    """The shard's lines in order, minus the custom_ids earlier attempts finished; counts those passed over."""

    def __init__(self, blobs: BlobStore, spec: ShardSpec, skip: set[str]) -> None:
        self.blobs = blobs
        self.spec = spec
        self.skip = skip
        self.skipped = 0

    def __iter__(self) -> Iterator[PendingRequest]:
        for req in shard_requests(self.blobs, self.spec):
            if req.custom_id in self.skip:
                self.skipped += 1
                continue
            yield PendingRequest(n=req.number, custom_id=req.custom_id, body=req.body)


def read_progress(blobs: BlobStore, prefix: str) -> Progress:
    """Collects the custom_ids every earlier checkpoint of this shard holds."""
    progress = Progress()
    for key in blobs.list_keys(prefix):
        m = CHECKPOINT_RE.match(key[len(prefix):])
        if m is None:
            continue
        progress.next_seq = max(progress.next_seq, int(m.group(1)) + 1)
        progress.attempts.add(m.group(2))
        progress.checkpoints += 1
        for raw in iter_object_lines(blobs, key):
            try:
                line = json.loads(raw)
                custom_id = str(line["custom_id"])
            except (ValueError, KeyError, TypeError):
                # A checkpoint PUT is atomic, so this should not happen; if it does, the line is simply rerun.
                log.warning("unreadable result line in %s; its request will run again", key)
                continue
            if custom_id in progress.done_ids:
                continue
            progress.done_ids.add(custom_id)
            _count_tokens(progress, line)
    return progress


def _count_tokens(progress: Progress, line: Any) -> None:
    response = line.get("response") if isinstance(line, dict) else None
    if not isinstance(response, dict) or not 200 <= int(response.get("status_code") or 0) < 300:
        return
    body = response.get("body")
    if isinstance(body, dict):
        prompt, completion = usage_tokens(body)
        progress.input_tokens += prompt
        progress.output_tokens += completion
