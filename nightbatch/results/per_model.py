"""Per-model figures of a batch whose lines name more than one model (`nightbatch.models`).

Validate records each model's line count; Finalize replaces it with request counts, usage and cost per
model. A shard serves one model, so its lines, tokens and GPU time belong to it; a shard whose lines name
several LoRA adapters of that model is split per line (its segments say which adapter each custom_id uses)
and its GPU time in proportion to the lines of each adapter. Only such batches pay the second read of their
results; memory stays bounded by one shard's custom_ids, as in Finalize.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from nightbatch import layout
from nightbatch.aws import BlobStore
from nightbatch.batches.cost import ShardTime, collect_shard_times, cost_summary
from nightbatch.ids import custom_id_digest
from nightbatch.results.lines import ResultSummary, Tally
from nightbatch.results.precedence import checkpoints_in_order, first_results
from nightbatch.settings import Settings
from nightbatch.shards.index import SegmentEntry, SegmentIndex, read_segments
from nightbatch.shards.lines import shard_ids
from nightbatch.shards.spec import read_manifest, read_shard, shard_spec


def model_counts(lines: dict[str, int]) -> dict[str, dict[str, Any]]:
    """What Validate records: each model's lines, none finished yet."""
    return {name: {"request_counts": {"total": n, "completed": 0, "failed": 0}} for name, n in lines.items()}


class _Model:
    def __init__(self) -> None:
        self.tally = Tally()
        self.time = ShardTime()

    def add_time(self, t: ShardTime, share: float) -> None:
        self.time.add(t, share)


def per_model_report(blobs: BlobStore, settings: Settings, batch_id: str, batch_model: str,
                     billing: Mapping[str, tuple[float, float]] | None = None) -> dict[str, Any]:
    """`nightbatch.models` of a finished batch: {model: {request_counts, usage, cost}}, lines never run
    counted as failed for the model they named."""
    index = read_segments(blobs, batch_id)
    entries = {s.key: s for s in index.segments}
    out: dict[str, _Model] = {}

    def of(name: str) -> _Model:
        return out.setdefault(name, _Model())

    items = read_manifest(blobs, batch_id)
    if not items:  # never planned: every validated line is unrun
        for s in index.segments:
            of(s.model or batch_model).tally.failed += s.lines
    for item in items:
        shard = read_shard(blobs, batch_id, item.shard_id)
        if shard is None:
            continue
        lines = shard.models or {shard.model: shard.lines}
        times = collect_shard_times(blobs, [layout.results_prefix(batch_id, shard.shard_id)])
        for name, n in lines.items():
            of(name).add_time(times, n / max(1, shard.lines))
        if len(lines) == 1:
            _tally_shard(blobs, batch_id, shard.shard_id, of(next(iter(lines))).tally, shard.lines)
        else:
            segments = [entries[k] for k in (shard.indexes or shard.segments) if k in entries]
            _tally_mixed(blobs, batch_id, shard.shard_id, index, segments, batch_model, of)
    return {name: {
        "request_counts": {"total": m.tally.completed + m.tally.failed, "completed": m.tally.completed,
                           "failed": m.tally.failed},
        "usage": m.tally.usage(),
        "cost": cost_summary(settings, m.time, m.tally.usage()["total_tokens"], m.tally.output_tokens,
                             billing=billing),
    } for name, m in out.items()}


def _results(blobs: BlobStore, batch_id: str, shard_id: str, seen: set[int]) -> Iterator[tuple[int, ResultSummary]]:
    """(digest, summary) of each shard result line, the first per custom_id (as Finalize keeps it)."""
    for cp in checkpoints_in_order(blobs, batch_id, shard_id):
        for result in first_results(blobs, cp.key, seen):
            yield result.digest, result.summary


def _tally_shard(blobs: BlobStore, batch_id: str, shard_id: str, tally: Tally, lines: int) -> None:
    seen: set[int] = set()
    for _, summary in _results(blobs, batch_id, shard_id, seen):
        if summary.ok:
            tally.add_success(summary.usage)
        else:
            tally.failed += 1
    tally.failed += max(0, lines - len(seen))  # unrun lines: Finalize writes an error line for each


def _tally_mixed(blobs: BlobStore, batch_id: str, shard_id: str, index: SegmentIndex,
                 segments: list[SegmentEntry], batch_model: str, of: Callable[[str], _Model]) -> None:
    names: list[str] = []
    model_of: dict[int, int] = {}  # custom_id digest -> index into names
    for segment in segments:
        name = segment.model or batch_model
        if name not in names:
            names.append(name)
        at = names.index(name)
        # One segment's lines, read as the worker reads its shard (a one-segment shard of the same index).
        one = shard_spec(index, [segment], batch_id=batch_id, shard_id=shard_id)
        for _, custom_id in shard_ids(blobs, one):
            model_of[custom_id_digest(custom_id)] = at
    seen: set[int] = set()
    for d, summary in _results(blobs, batch_id, shard_id, seen):
        found = model_of.pop(d, None)
        if found is None:
            continue
        tally = of(names[found]).tally
        if summary.ok:
            tally.add_success(summary.usage)
        else:
            tally.failed += 1
    for unrun in model_of.values():
        of(names[unrun]).tally.failed += 1
