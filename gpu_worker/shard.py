"""A shard in S3: its definition, its lines streamed in order (nightbatch/shards/lines.py), the results
already checkpointed."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

from gpu_worker.results import usage_tokens
from nightbatch import layout
from nightbatch.aws import BlobStore
from nightbatch.ids import custom_id_digest
from nightbatch.layout import CHECKPOINT_RE
from nightbatch.results.precedence import first_results
from nightbatch.shards.lines import shard_requests
from nightbatch.shards.spec import ShardSpec, read_shard
from nightbatch.tenancy.scope import Scope
from nightbatch.validation.line import RequestLine

log = logging.getLogger("gpu_worker.shard")

@dataclass
class Progress:
    """What earlier attempts left in S3: the digests of the finished custom_ids (this shard only: bounded),
    the next seq."""

    done: set[int] = field(default_factory=set)
    next_seq: int = 0
    attempts: set[str] = field(default_factory=set)
    checkpoints: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


def load_shard(blobs: BlobStore, batch_id: str, shard_id: str) -> ShardSpec:
    spec = read_shard(blobs, batch_id, shard_id)
    if spec is None:
        key = layout.shard_key(batch_id, shard_id)
        raise FileNotFoundError(f"shard definition s3://{blobs.bucket}/{key} does not exist")
    return spec


class PendingLines:
    """The shard's lines in order, minus the custom_ids earlier attempts finished; counts those passed over."""

    def __init__(self, blobs: BlobStore, spec: ShardSpec, skip: set[int], *, scope: Scope | None = None) -> None:
        self.blobs = blobs
        self.spec = spec
        self.skip = skip
        self.skipped = 0
        self.scope = scope  # the shard's tenant: the reader checks each input object against it

    def __iter__(self) -> Iterator[RequestLine]:
        for req in shard_requests(self.blobs, self.spec, scope=self.scope):
            if self.skip and custom_id_digest(req.custom_id) in self.skip:
                self.skipped += 1
                continue
            yield req


def read_progress(blobs: BlobStore, prefix: str) -> Progress:
    """The custom_ids every earlier checkpoint of this shard holds, the first result of each counted, read as
    Finalize reads them (nightbatch.results.precedence.first_results)."""
    progress = Progress()
    for key in sorted(blobs.list_keys(prefix)):
        m = CHECKPOINT_RE.fullmatch(key[len(prefix):])
        if m is None:
            continue
        progress.next_seq = max(progress.next_seq, int(m.group(1)) + 1)
        progress.attempts.add(m.group(2))
        progress.checkpoints += 1
        for result in first_results(blobs, key, progress.done):
            if result.summary.ok:
                prompt, completion = usage_tokens({"usage": result.summary.usage})
                progress.input_tokens += prompt
                progress.output_tokens += completion
    return progress
