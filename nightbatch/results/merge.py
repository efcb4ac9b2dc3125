"""A shard's checkpoints merged into the output and error files: which result of a custom_id counts, and where
its bytes go.

The rule is `checkpoints_in_order` (nightbatch.results.precedence, which the partial results read too)
and `merge_shard`: checkpoints in key order (seq, then attempt), the first result per custom_id wins and later
ones (a zombie attempt's, a re-run's) are dropped. Successful lines go to the output as ranges of the checkpoint
objects (nightbatch/results/compose.py), the others to the error file. A checkpoint with a summary
(results/lines.py: CheckpointSummary) is counted and placed from it, unparsed: only its error lines, its dropped
duplicates and the bytes the composer must upload are read. One without (a worker of 0.1.x, a summary
that was not written or does not match), or under PARSE_BELOW bytes, is read line by line.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import accumulate, islice
from typing import Protocol

from nightbatch.aws import BlobStore
from nightbatch.ids import custom_id_digests
from nightbatch.results.compose import Read
from nightbatch.results.lines import CheckpointSummary, Tally, read_checkpoint_summary, summarize_result_line
from nightbatch.results.precedence import Checkpoint, FirstResult, Listing, checkpoints_in_order, first_results

log = logging.getLogger("nightbatch.finalize")
WINDOW_BYTES = 1024 * 1024  # least bytes of a ranged GET of a summarized checkpoint
AHEAD = 8  # summaries fetched while earlier checkpoints are merged (S3 latency, not CPU)
# A checkpoint smaller than this is parsed, its summary left unread: all its bytes are read anyway (too small to
# be copied, they are uploaded), so parsing costs that one GET where the summary costs a second one, and its few
# lines (an attempt's first checkpoint: 64) cost less CPU to parse than that request.
PARSE_BELOW = 128 * 1024


class Output(Protocol):
    def add_range(self, source: str, start: int, end: int, read: Read) -> None: ...

    def add_bytes(self, data: bytes | memoryview) -> None: ...


class Errors(Protocol):
    def write(self, data: bytes) -> None: ...


class InputOrderOutput(Protocol):
    """Where the winning successes go when the output is in input order (results/input_order.py)."""

    def add_run(self, key: str, summary: CheckpointSummary, skip: list[int]) -> None: ...

    def add_line(self, result: FirstResult) -> None: ...


def merge_shard(blobs: BlobStore, batch_id: str, shard_id: str, seen: set[int], out: Output, err: Errors,
                tally: Tally, listed: Listing | None = None, by_input: InputOrderOutput | None = None) -> None:
    """Adds the shard's winning results to `out` and `err` and counts them in `tally`; `seen` holds the
    custom_id digests taken so far, and grows by this shard's. `listed`: the shard's objects, if listed already
    (nightbatch.results.precedence.results_listing). `by_input`: the batch's output goes in input order, so the
    successes go to it (nightbatch.results.input_order), not to `out`; the errors still go to `err`."""
    for cp, summary in _with_summaries(blobs, checkpoints_in_order(blobs, batch_id, shard_id, listed), by_input):
        if (summary is not None and summary.size == cp.size and summary.etag == cp.etag and summary.consistent()
                and (by_input is None or summary.numbered())):
            _merge_summarized(blobs, cp.key, summary, seen, out, err, tally, by_input)
            continue
        if _wants_summary(cp, by_input):
            log.warning("summary of %s unreadable, not matching or without line numbers; its lines are parsed",
                        cp.key, extra={"batch_id": batch_id})
        _merge_parsed(blobs, batch_id, cp.key, seen, out, err, tally, by_input)


def _wants_summary(cp: Checkpoint, by_input: InputOrderOutput | None) -> bool:
    """Whether the checkpoint is placed from its summary (else parsed): it has one and is not under PARSE_BELOW
    (for input order any size: its summary holds the line numbers the order needs)."""
    return cp.summarized and (cp.size >= PARSE_BELOW or by_input is not None)


def _with_summaries(blobs: BlobStore, checkpoints: list[Checkpoint], by_input: InputOrderOutput | None) -> Iterator[
        tuple[Checkpoint, CheckpointSummary | None]]:
    def fetch(cp: Checkpoint) -> CheckpointSummary | None:
        return read_checkpoint_summary(blobs, cp.key) if _wants_summary(cp, by_input) else None

    todo = iter(checkpoints)
    with ThreadPoolExecutor(AHEAD, thread_name_prefix="summaries") as pool:
        queued: deque[tuple[Checkpoint, Future[CheckpointSummary | None]]] = deque(
            (cp, pool.submit(fetch, cp)) for cp in islice(todo, AHEAD))
        while queued:
            cp, summary = queued.popleft()
            nxt = next(todo, None)
            if nxt is not None:
                queued.append((nxt, pool.submit(fetch, nxt)))
            yield cp, summary.result()


class Window:
    """Ranged reads of one object, moving forward; each byte is fetched once, in GETs of WINDOW_BYTES or more
    (so the lines of a small checkpoint, or error lines close together, cost one GET)."""

    def __init__(self, blobs: BlobStore, key: str, size: int) -> None:
        self.blobs, self.key, self.size = blobs, key, size
        self.lo = self.hi = 0
        self.data = b""  # the bytes [lo, hi)

    def read(self, start: int, end: int) -> memoryview:
        if not self.lo <= start <= self.hi:
            self.lo = self.hi = start
            self.data = b""
        if end > self.hi:
            more = self.blobs.get_range(self.key, self.hi, min(self.size, max(end, self.hi + WINDOW_BYTES)))
            self.data = self.data[start - self.lo:] + more
            self.lo, self.hi = start, self.hi + len(more)
        return memoryview(self.data)[start - self.lo:end - self.lo]


def _merge_summarized(blobs: BlobStore, key: str, summary: CheckpointSummary, seen: set[int], out: Output,
                      err: Errors, tally: Tally, by_input: InputOrderOutput | None) -> None:
    digests = custom_id_digests(summary.custom_ids)
    dropped: set[int] = set()
    if not seen.isdisjoint(digests):
        dropped = _repeats(digests, seen)
    else:
        taken = len(seen)
        seen.update(digests)
        if len(seen) - taken != len(digests):  # a custom_id twice in this checkpoint: only the first counts
            dropped = _repeats(digests, set())
    tally.add_summary(summary)
    failed = set(summary.failed)
    skip = sorted(failed | dropped)  # lines that leave the output's run: usually none
    ends = list(accumulate(summary.lengths)) if skip else []
    window = Window(blobs, key, summary.size)
    if by_input is not None:  # the successes are the input order's run; the ranges below only pass them over
        by_input.add_run(key, summary, skip)
        out = _NOWHERE
    less = Tally()  # the dropped duplicates, taken back out of the summary's totals
    pos = 0  # start of the run of lines that go to the output as they are
    for i in skip:
        start = ends[i - 1] if i else 0
        out.add_range(key, pos, start, window.read)
        line = bytes(window.read(start, ends[i]))
        if i not in dropped:
            err.write(line)
        elif i in failed:
            less.failed += 1
        else:
            less.add_success(summarize_result_line(line[:-1]).usage)
        pos = ends[i]
    out.add_range(key, pos, summary.size, window.read)
    tally.subtract(less)


def _repeats(digests: list[int], seen: set[int]) -> set[int]:
    """Indices of the lines whose custom_id is in `seen` or came earlier (rare: a zombie attempt, a re-run);
    adds the others to `seen`."""
    repeats = set()
    for i, d in enumerate(digests):
        if d in seen:
            repeats.add(i)
        seen.add(d)
    return repeats


class _Nowhere:
    def add_range(self, source: str, start: int, end: int, read: Read) -> None:
        pass

    def add_bytes(self, data: bytes | memoryview) -> None:
        pass


_NOWHERE = _Nowhere()


def _merge_parsed(blobs: BlobStore, batch_id: str, key: str, seen: set[int], out: Output, err: Errors,
                  tally: Tally, by_input: InputOrderOutput | None) -> None:
    for result in first_results(blobs, key, seen):
        if result.summary.ok:
            if by_input is not None:
                by_input.add_line(result)
            else:
                out.add_bytes(result.data + b"\n")
            tally.add_success(result.summary.usage)
        else:
            err.write(result.data + b"\n")
            tally.failed += 1
