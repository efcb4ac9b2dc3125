"""The output file in input order (`nightbatch.output_order: "input"`), at bounded memory: a merge of sorted runs.

The worker writes each checkpoint's lines in input order, with their input line numbers in its summary
(gpu_worker/checkpoints.py, results/lines.py: CheckpointSummary.numbers), so every checkpoint is a sorted run
(or two, once an attempt's last lines were appended to it).
Which result of a custom_id wins, and what goes to the error file, is decided as for any batch, in the merge
order (nightbatch.results.merge, nightbatch.results.precedence); with input order the merge hands each checkpoint's
winners here instead of to the output: the checkpoint and the indices the output leaves out. Once every shard is
merged, `write` merges the runs by line number into the output. A run is opened when the merge reaches its first
number (its summary read again, its bytes through a forward window) and closed at its end; the stretch of a run
that comes before every other run's next line goes out as one range, copied server-side when it passes S3's part
floor, so checkpoints that do not overlap (requests finishing about in the order they were sent) are copied
whole, as in completion order. Memory holds only the open runs' summaries and windows: those whose span of
numbers covers the merge's position.

A checkpoint without line numbers (a worker of 0.1.x, or a missing or not matching summary: it is
parsed) gives its winning lines as they are; their numbers are found by reading the shard's input for their
custom_ids (one pass a shard, only when it has such lines), and they wait in memory as one more run, bounded
by how many such checkpoints there are: none on a batch 0.2 ran.
"""

from __future__ import annotations

import heapq
import logging
import sys
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass
from itertools import accumulate, count
from typing import Protocol

from nightbatch.aws import BlobStore
from nightbatch.ids import custom_id_digest
from nightbatch.results.lines import CheckpointSummary, read_checkpoint_summary
from nightbatch.results.merge import Output, Window
from nightbatch.results.precedence import FirstResult, PlannedShard
from nightbatch.shards.lines import shard_ids

log = logging.getLogger("nightbatch.finalize")
END = sys.maxsize  # after every line number


@dataclass(frozen=True)
class SortedRun:
    """Successes of a summarized checkpoint: its lines [lo, hi), whose numbers ascend, but `skip` (ascending
    indices: failed, or a custom_id that won elsewhere); the first of them has input line `first`."""

    key: str
    size: int
    etag: str
    lo: int
    hi: int
    first: int
    skip: tuple[int, ...]


class _MergeCursor(Protocol):
    head: int  # the line number of its next line; END when it has none left

    def emit(self, limit: int, out: Output) -> None:
        """Sends its lines numbered below `limit` to `out` and moves past them."""


class InputOrder:
    def __init__(self, blobs: BlobStore, batch_id: str) -> None:
        self.blobs, self.batch_id = blobs, batch_id
        self.runs: list[SortedRun] = []
        self.loose: list[tuple[int, bytes]] = []  # (line number, line): lines of checkpoints without numbers
        self._unnumbered: list[FirstResult] = []  # of the shard being merged

    def add_run(self, key: str, summary: CheckpointSummary, skip: list[int]) -> None:
        """A checkpoint with line numbers (summary.numbered()) whose lines but `skip` are successes that won."""
        for lo, hi in summary.ascending():
            left = tuple(k for k in skip if lo <= k < hi)
            first = lo + next(i for i, k in enumerate([*left, -1]) if k != lo + i)  # the first line kept
            if first < hi:
                self.runs.append(SortedRun(key, summary.size, summary.etag, lo, hi, summary.numbers[first], left))

    def add_line(self, result: FirstResult) -> None:
        """A winning success of a checkpoint without line numbers (parsed by the merge)."""
        self._unnumbered.append(result)

    def end_shard(self, shard: PlannedShard) -> None:
        """The shard's merge is done: its lines without numbers get theirs from its input."""
        if not self._unnumbered:
            return
        want = {r.digest: r for r in self._unnumbered}
        self._unnumbered = []
        spec = shard.spec
        for number, custom_id in shard_ids(self.blobs, spec) if spec is not None else ():
            r = want.pop(custom_id_digest(custom_id), None)
            if r is not None:
                self.loose.append((number, r.data + b"\n"))
                if not want:
                    break
        for r in want.values():  # a result no line of the shard asked for: kept, at the end, rather than lost
            log.error("result %s is of no line of shard %s; it goes at the end of the output", r.summary.custom_id,
                      shard.shard_id, extra={"batch_id": self.batch_id})
            self.loose.append((END - 1, r.data + b"\n"))

    def write(self, out: Output) -> None:
        """Every run and loose line into `out`, in input line order."""
        pending: deque[SortedRun] = deque(sorted(self.runs, key=lambda r: r.first))
        heap: list[tuple[int, int, _MergeCursor]] = []
        ties = count()
        if self.loose:
            self.loose.sort(key=lambda x: x[0])
            heap.append((self.loose[0][0], next(ties), _Loose(self.loose)))
        while heap or pending:
            while pending and (not heap or pending[0].first < heap[0][0]):
                cursor = _RunCursor(self.blobs, pending.popleft())
                heapq.heappush(heap, (cursor.head, next(ties), cursor))
            head, tie, cur = heapq.heappop(heap)
            nxt = min(heap[0][0] if heap else END, pending[0].first if pending else END)
            cur.emit(max(nxt, head + 1), out)  # at least its next line (two runs never hold one line's winner)
            if cur.head != END:
                heapq.heappush(heap, (cur.head, tie, cur))
        self.loose = []


class _RunCursor:
    def __init__(self, blobs: BlobStore, run: SortedRun) -> None:
        summary = read_checkpoint_summary(blobs, run.key)
        if (summary is None or summary.size != run.size or summary.etag != run.etag or not summary.numbered()
                or (run.lo, run.hi) not in summary.ascending()):
            # Read and matched a moment ago by the merge; checkpoints are never rewritten. Finalize is retried.
            raise RuntimeError(f"summary of {run.key} changed while the output was written")
        self.key, self.numbers, self.skip, self.hi = run.key, summary.numbers, run.skip, run.hi
        self.ends = list(accumulate(summary.lengths))
        self.window = Window(blobs, run.key, run.size)
        self.i, self.s = run.lo, 0  # next line; next entry of skip
        self._pass_skipped()

    def _pass_skipped(self) -> None:
        while self.s < len(self.skip) and self.skip[self.s] == self.i:
            self.i += 1
            self.s += 1
        self.head = self.numbers[self.i] if self.i < self.hi else END

    def emit(self, limit: int, out: Output) -> None:
        j = bisect_left(self.numbers, limit, self.i, self.hi)
        start = self.ends[self.i - 1] if self.i else 0
        while self.s < len(self.skip) and self.skip[self.s] < j:
            k = self.skip[self.s]
            out.add_range(self.key, start, self.ends[k - 1] if k else 0, self.window.read)
            start = self.ends[k]
            self.s += 1
        out.add_range(self.key, start, self.ends[j - 1] if j else 0, self.window.read)
        self.i = j
        self._pass_skipped()


class _Loose:
    def __init__(self, lines: list[tuple[int, bytes]]) -> None:
        self.lines, self.i = lines, 0
        self.head = lines[0][0] if lines else END

    def emit(self, limit: int, out: Output) -> None:
        while self.i < len(self.lines) and self.lines[self.i][0] < limit:
            out.add_bytes(self.lines[self.i][1])
            self.i += 1
        self.head = self.lines[self.i][0] if self.i < len(self.lines) else END
