"""Validate's output: segments as line indexes (shards/index.py: LineIndex), references into the input, not copies.

A segment is up to `max_lines` valid lines of one prefix group (group 0: lines in input order; groups 1..n:
long prompts by prefix, nightbatch/pipeline/prefixes.py) and one `body.model` (a batch may name several models
or LoRA adapters, and each shard serves one engine), or fewer once its ranges span `max_bytes` of input
(so that shards stay balanced by bytes as well). Consecutive input lines of a segment form one run, one
byte range; blank lines between them stay inside the run (the reader skips them, numbered, as Validate
did). What S3 receives is a few bytes per line (its estimate), never the line: the segments' indexes are packed,
one JSON line each, into objects of up to PACK_BYTES (layout.line_index_pack_key), so a batch costs a PUT per
pack rather than one per segment (a request costs the Lambda more CPU than a segment's few kilobytes of JSON),
and a segment names its index by a range of its pack (shards/index.py: packed_ref).
"""

from __future__ import annotations

import bisect
import itertools
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from nightbatch import layout
from nightbatch.aws import BlobStore
from nightbatch.files.sources import InputSource
from nightbatch.shards.index import (
    LineIndex,
    SegmentEntry,
    SegmentIndex,
    line_index_line,
    packed_ref,
    write_line_index_pack,
    write_segment_index,
)

PACK_BYTES = 4 * 1024 * 1024  # a pack is sent once it holds this much (1M lines of one model: about one pack)


@dataclass(slots=True)
class _Open:
    """The segment being filled for one (prefix group, model)."""

    group: int
    model: str
    runs: list[tuple[int, int, int]] = field(default_factory=list)
    est: list[int] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)  # lines of each closed run
    first: int = 0  # the open run: its first line number, start, end, the number of the line that continues it
    start: int = -1
    end: int = 0
    next: int = 0
    spanned: int = 0  # input bytes of the closed runs

    def close_run(self) -> None:
        if self.start >= 0:
            self.runs.append((self.first, self.start, self.end))
            self.counts.append(self.next - self.first)
            self.spanned += self.end - self.start
            self.start = -1


@dataclass
class IndexWriter:
    """Buffers at most one segment's index per (prefix group, model), then adds it to the pack, which is PUT
    once it holds PACK_BYTES and at `close`; records (reference, lines, est, group, bytes, model) for Plan."""

    blobs: BlobStore
    batch_id: str
    max_lines: int
    max_bytes: int
    open: dict[tuple[int, str], _Open] = field(default_factory=dict)
    index: list[SegmentEntry] = field(default_factory=list)
    # The last line's open segment: a line of the same (group, model) extends its run without a lookup (the
    # common case, and every line of a batch with one model and no long prompts).
    _seg: _Open | None = None
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(2, thread_name_prefix="segments"))
    pending: list[Future[None]] = field(default_factory=list)
    pack: bytearray = field(default_factory=bytearray)  # the pack being filled
    packs: int = 0  # packs sent

    def add(self, number: int, offset: int, size: int, est: int, group: int = 0, model: str = "",
            custom_id: str = "") -> None:
        seg = self._seg
        if seg is None or seg.group != group or seg.model != model:
            seg = self._switch(group, model)
        if seg.start >= 0 and number != seg.next:
            seg.close_run()  # a blank line between: a run holds none, so its lines' numbers follow from `first`
        if seg.start < 0:
            seg.first, seg.start = number, offset
        end = seg.end = offset + size
        seg.next = number + 1
        ests = seg.est
        ests.append(est)
        seg.ids.append(custom_id)
        if len(ests) >= self.max_lines or seg.spanned + end - seg.start >= self.max_bytes:
            self.flush((group, model))

    def add_block(self, number: int, offset: int, sizes: list[int], est: list[int], model: str,
                  ids: list[str]) -> None:
        """`add` of consecutive lines of group 0 (a block of nightbatch.jsonl: the first numbered `number`
        starting at `offset`, each followed by a newline), a segment at a time rather than a line at a time:
        the same segments and runs."""
        # starts[i]: where line i starts; line i ends at starts[i + 1] - 1.
        starts = list(itertools.accumulate(map((1).__add__, sizes), initial=offset))
        i, k = 0, len(sizes)
        while i < k:
            seg = self._seg
            if seg is None or seg.group != 0 or seg.model != model:
                seg = self._switch(0, model)
            if seg.start >= 0 and number + i != seg.next:
                seg.close_run()
            if seg.start < 0:
                seg.first, seg.start = number + i, starts[i]
            # The first line j after which `add` would flush (or the block's last): the segment then holds
            # max_lines, or spans max_bytes (seg.spanned + starts[j + 1] - 1 - seg.start >= max_bytes).
            limit = seg.start + self.max_bytes - seg.spanned + 1
            j = min(i + self.max_lines - len(seg.est), bisect.bisect_left(starts, limit, i + 1), k) - 1
            seg.est.extend(est[i:j + 1])
            seg.ids.extend(ids[i:j + 1])
            seg.end = starts[j + 1] - 1
            seg.next = number + j + 1
            if len(seg.est) >= self.max_lines or seg.spanned + seg.end - seg.start >= self.max_bytes:
                self.flush((0, model))
            i = j + 1

    def break_runs(self) -> None:
        """An object of an in-place input ends here: the next line starts a run of its own (a run lies in one
        object, so a changed object is a known set of lines: nightbatch/shards/lines.py)."""
        for seg in self.open.values():
            seg.close_run()

    def _switch(self, group: int, model: str) -> _Open:
        """The open segment of another (group, model) than the last line's: its run ended before the lines
        between."""
        seg = self.open.get((group, model))
        if seg is None:
            seg = self.open[(group, model)] = _Open(group, model)
        self._seg = seg
        seg.close_run()
        return seg

    def flush(self, slot: tuple[int, str]) -> None:
        seg = self.open.pop(slot, None)
        if seg is self._seg:
            self._seg = None
        if seg is None or not seg.est:
            return
        seg.close_run()
        start = len(self.pack)
        self.pack += line_index_line(LineIndex(runs=seg.runs, est=seg.est, ids=seg.ids,
                                               counts=seg.counts))
        ref = packed_ref(layout.line_index_pack_key(self.batch_id, self.packs), start, len(self.pack))
        self.index.append(SegmentEntry(key=ref, lines=len(seg.est), est=sum(seg.est), group=slot[0],
                                       bytes=seg.spanned, model=slot[1]))
        if len(self.pack) >= PACK_BYTES:
            self._send_pack()

    def _send_pack(self) -> None:
        if not self.pack:
            return
        key = layout.line_index_pack_key(self.batch_id, self.packs)
        # At most two PUTs in flight while validation goes on (overlapped I/O, bounded memory).
        while len(self.pending) >= 2:
            self.pending.pop(0).result()
        self.pending.append(self.pool.submit(write_line_index_pack, self.blobs, key, bytes(self.pack)))
        self.pack = bytearray()
        self.packs += 1

    def abandon(self) -> None:
        for f in self.pending:
            f.result()
        self.pool.shutdown()

    def close(self, source: InputSource) -> None:
        for slot in sorted(self.open):
            self.flush(slot)
        self._send_pack()
        for f in self.pending:
            f.result()
        self.pool.shutdown()
        write_segment_index(self.blobs, self.batch_id,
                            SegmentIndex(input=source, segments=self.index))
