"""The order in which Finalize merges results, which decides between two results of one custom_id (the first
wins): shards in plan order, each shard's checkpoints in key order. Finalize and the partial results
(nightbatch.results.partial) both read them through these two functions. Light on imports: the API
imports it without the workflow's steps."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

from nightbatch import layout
from nightbatch.aws import BlobStore
from nightbatch.aws.parts import PartStore
from nightbatch.ids import custom_id_digest
from nightbatch.jsonl import split_lines
from nightbatch.results.lines import MAX_RESULT_LINE, ResultSummary, summarize_result_line
from nightbatch.shards.index import read_segments
from nightbatch.shards.spec import ShardSpec, read_manifest, read_shard, shard_spec

log = logging.getLogger("nightbatch.results")


class PlannedShard:
    """A shard of the manifest: its id (None: the segments no shard took), its lines (the manifest item's), and
    its spec, read only when asked (for lines that got no result)."""

    def __init__(self, blobs: BlobStore, batch_id: str, shard_id: str | None, lines: int | None,
                 spec: ShardSpec | None = None) -> None:
        self.blobs, self.batch_id, self.shard_id = blobs, batch_id, shard_id
        if spec is not None:
            self.spec = spec  # given: never read
        if lines is None:  # a manifest written before its items carried the lines
            lines = self.spec.lines if self.spec is not None else 0
        self.lines = lines

    @cached_property
    def spec(self) -> ShardSpec | None:
        """Its spec (None: Plan's spec object is gone, and its lines cannot be read)."""
        return read_shard(self.blobs, self.batch_id, self.shard_id or "")


def planned_shards(blobs: BlobStore, batch_id: str) -> Iterator[PlannedShard]:
    """Each planned shard, in merge order; then, if the batch was never planned, its unrun segments as one."""
    items = read_manifest(blobs, batch_id)
    if items:
        for item in items:
            yield PlannedShard(blobs, batch_id, item.shard_id, item.lines)
        return
    # Never planned, or planned after a cancel/expiry (empty manifest): every validated segment is unrun.
    index = read_segments(blobs, batch_id)
    if index.segments:
        yield PlannedShard(blobs, batch_id, None, None,
                           shard_spec(index, index.segments, batch_id=batch_id, shard_id=""))


@dataclass(frozen=True)
class Checkpoint:
    key: str
    size: int
    etag: str
    summarized: bool  # its summary object was listed beside it


Listing = Mapping[str, tuple[int, str]]  # key -> (size, ETag), as PartStore.listing gives it


def results_listing(blobs: BlobStore, batch_id: str) -> dict[str, Listing]:
    """Every object under the batch's results prefix, by shard id, in one listing (a page per 1,000 objects)
    rather than one per shard: what Finalize hands to `checkpoints_in_order` and its other readers."""
    root = layout.all_results_prefix(batch_id)
    out: dict[str, dict[str, tuple[int, str]]] = {}
    for key, meta in PartStore(blobs).listing(root).items():
        shard_id, _, name = key[len(root):].partition("/")
        if name:
            out.setdefault(shard_id, {})[key] = meta
    return dict(out)


def checkpoints_in_order(blobs: BlobStore, batch_id: str, shard_id: str,
                         listed: Listing | None = None) -> list[Checkpoint]:
    """The shard's checkpoints in the order that decides between results of one custom_id: key order (seq, then
    attempt); the first wins. `listed`: the shard's objects already listed (`results_listing`), else listed
    here."""
    prefix = layout.results_prefix(batch_id, shard_id)
    if listed is None:
        listed = PartStore(blobs).listing(prefix)
    return [Checkpoint(k, *listed[k], layout.checkpoint_summary_key(k) in listed)
            for k in sorted(k for k in listed if layout.is_checkpoint(prefix, k))]


class FirstResult(NamedTuple):
    data: bytes             # the result line, without its newline
    summary: ResultSummary
    digest: int             # of its custom_id (nightbatch.ids.custom_id_digest)
    end: int                # where the line ends in its checkpoint (its newline counted)


def first_results(blobs: BlobStore, key: str, seen: set[int]) -> Iterator[FirstResult]:
    """The lines of one checkpoint, read by Finalize's parsing path, whose custom_id is not in `seen` yet (it
    grows by theirs): the first-wins rule, for Finalize, the partial results, the per-model figures and the
    worker's resume. A line that is blank, over MAX_RESULT_LINE or unreadable (workers write neither) is passed
    over, and logged: its request stays unrun, so it is run again or reported unrun, never lost."""
    for raw in split_lines(blobs.iter_chunks_ahead(key), max_bytes=MAX_RESULT_LINE):
        if not raw.data:
            if raw.data is None:
                log.error("result line %d of %s is %d bytes, over %d: its request is reported unrun", raw.number,
                          key, raw.size, MAX_RESULT_LINE)
            continue
        try:
            summary = summarize_result_line(raw.data)
        except (ValueError, KeyError, TypeError, AttributeError):
            log.error("result line %d of %s is not a result line: its request is reported unrun", raw.number, key)
            continue
        d = custom_id_digest(summary.custom_id)
        if d not in seen:
            seen.add(d)
            yield FirstResult(raw.data, summary, d, raw.offset + raw.size + 1)
