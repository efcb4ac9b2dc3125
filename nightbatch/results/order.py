"""The order in which Finalize merges results, which decides between two results of one custom_id (the first
wins): shards in plan order, each shard's checkpoints in key order. Finalize and the partial results
(nightbatch.results.partial) both read them through these two functions. Light on imports: the API
imports it without the workflow's steps."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from nightbatch import layout
from nightbatch.storage import BlobStore
from nightbatch.storage.parts import PartStore


def planned_shards(blobs: BlobStore, batch_id: str) -> Iterator[tuple[str | None, layout.ShardSpec]]:
    """(shard_id, spec) per planned shard, in merge order; shard_id None for the segments no shard took."""
    items = layout.read_manifest(blobs, batch_id)
    if items:
        for item in items:
            shard = layout.read_shard(blobs, batch_id, item.shard_id)
            if shard is not None:
                yield shard.shard_id, shard
        return
    # Never planned, or planned after a cancel/expiry (empty manifest): every validated segment is unrun.
    index = layout.read_segments(blobs, batch_id)
    if index.segments:
        yield None, layout.shard_spec(index, index.segments, batch_id=batch_id, shard_id="")


@dataclass(frozen=True)
class Checkpoint:
    key: str
    size: int
    summarized: bool  # its summary object was listed beside it


def checkpoints_in_order(blobs: BlobStore, batch_id: str, shard_id: str) -> list[Checkpoint]:
    """The shard's checkpoints in the order that decides between results of one custom_id: key order (seq, then
    attempt); the first wins."""
    prefix = layout.results_prefix(batch_id, shard_id)
    sizes = PartStore(blobs).sizes(prefix)
    return [Checkpoint(k, sizes[k], layout.checkpoint_summary_key(k) in sizes)
            for k in sorted(k for k in sizes if layout.is_checkpoint(prefix, k))]
