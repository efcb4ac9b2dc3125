"""Result lines: their one type and encoder (the worker's answers, the oversized and the unrun lines), their one
decoder (`summarize_result_line`: Finalize, the partial results, per-model figures, the worker's resume, retry),
the summary the worker writes beside each checkpoint of them (CheckpointSummary, its writer and reader), and the
tallies Finalize takes from the files."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from nightbatch.ids import batch_request_id
from nightbatch.jsonl import loads
from nightbatch.layout import checkpoint_summary_key

if TYPE_CHECKING:  # the summaries are read without the AWS adapters
    from nightbatch.aws import BlobStore

UNRUN_MESSAGES = {
    "batch_cancelled": "This request was not executed because the batch was cancelled.",
    "batch_expired": "This request could not be executed before the completion window expired.",
    "shard_failed": "This request was not executed: its shard failed after all retries.",
}


# The longest result line Finalize reads back (and so the longest a worker may write): bounded memory per line.
MAX_RESULT_LINE = 64 * 1024 * 1024


class Response(msgspec.Struct):
    status_code: int
    request_id: str | None
    body: Any


class Error(msgspec.Struct):
    code: str
    message: str


class RequestOutput(msgspec.Struct):
    """OpenAI's request output object: one line of an output or error file (the worker's gpu_worker.results
    ResultLine carries it encoded, with what a checkpoint counts of it). `response` for a request the engine answered
    (its status code says success or failure), `error` for one it never answered. Every result line is encoded
    by `encode` and read by `summarize_result_line`."""

    id: str
    custom_id: str
    response: Response | None
    error: Error | None


_encode = msgspec.json.Encoder().encode


def encode(batch_id: str, custom_id: str, *, response: Response | None = None, error: Error | None = None) -> bytes:
    """The line, compact JSON plus its newline (NaN and infinities in an engine's body written as null).
    Raises TypeError or ValueError (UnicodeEncodeError) when the body holds what JSON cannot."""
    return _encode(RequestOutput(batch_request_id(batch_id, custom_id), custom_id, response, error)) + b"\n"


def oversized_result_line(batch_id: str, custom_id: str, size: int) -> bytes:
    """What a worker writes instead of a result line over MAX_RESULT_LINE: that request's own error."""
    return error_line(batch_id, custom_id, "result_too_large", (
        f"The response to this request is {size} bytes, over the {MAX_RESULT_LINE}-byte limit of one "
        "result line; ask for fewer tokens, choices or inputs."))


def unrun_line(batch_id: str, custom_id: str, code: str) -> bytes:
    return error_line(batch_id, custom_id, code, UNRUN_MESSAGES[code])


def error_line(batch_id: str, custom_id: str, code: str, message: str) -> bytes:
    """A request's line with no response: it never reached an engine (`error` says why)."""
    return encode(batch_id, custom_id, error=Error(code, message))


class _Code(msgspec.Struct):
    code: Any = None  # engines' envelopes may carry a number


class _Body(msgspec.Struct):
    usage: dict[str, Any] | None = None
    error: Any = None  # an engine's error envelope


class _Response(msgspec.Struct):
    status_code: int
    body: _Body | None = None


class _Line(msgspec.Struct):
    """The fields a reader needs from a result line; msgspec skips the rest without building it."""

    custom_id: str
    response: _Response | None = None
    error: _Code | None = None


_decode_line = msgspec.json.Decoder(_Line).decode


@dataclass(frozen=True)
class ResultSummary:
    custom_id: str
    ok: bool
    usage: dict[str, Any]
    code: Any = None  # a failed line's error code: `error.code`, else the engine's `response.body.error.code`


def summarize_result_line(data: bytes) -> ResultSummary:
    """custom_id, success and usage of one result line, decoding only those fields."""
    try:
        line = _decode_line(data)
    except msgspec.MsgspecError:
        return _summarize_any(data)  # not shaped as our workers write it: the general path decides
    r = line.response
    ok = r is not None and 200 <= r.status_code < 300
    body = r.body if r is not None else None
    if ok:
        return ResultSummary(line.custom_id, True, (body.usage if body is not None else None) or {})
    code = line.error.code if line.error is not None and line.error.code else None
    if code is None and body is not None and isinstance(body.error, dict):
        code = body.error.get("code")
    return ResultSummary(line.custom_id, False, {}, code)


class CheckpointSummary(msgspec.Struct, kw_only=True):
    """The summary beside a checkpoint (layout.checkpoint_summary_key), written by the worker after each
    checkpoint: what Finalize needs to count and place the checkpoint's lines without parsing them
    (summarize_checkpoint, below).

    Line i of the checkpoint is its bytes [sum(lengths[:i]), sum(lengths[:i + 1])), compact JSON ended by a
    newline; custom_ids rather than digests, because our digest is keyed per process (nightbatch.ids). A reader
    that finds no summary, another version, or a size or ETag other than the checkpoint's parses the
    checkpoint: a summary is checked against the object it describes, not trusted.

    A msgspec struct, not a pydantic model: Finalize decodes one per checkpoint, a list of custom_ids and one of
    lengths per line, and msgspec does it in a third of the time (the JSON is the same; unknown fields ignored).
    """

    version: Literal[1] = 1
    size: int  # bytes of the checkpoint object it describes
    # Its ETag, as the checkpoint's PUT answered. 0.1.x's summaries may have none, nor `numbers`: Finalize then
    # parses the checkpoint (reading them may go in 0.3, with the defaults).
    etag: str = ""
    custom_ids: list[str]
    lengths: list[int]  # bytes of each line, its newline included
    failed: list[int] = []  # indices of the lines that are not successes (they go to the error file), ascending
    # The input line number of each line (the worker writes a checkpoint in input order, so they ascend): what
    # Finalize merges by for `output_order: "input"`. Empty: a summary of 0.1.x.
    numbers: list[int] = []
    # Usage over the successful lines, as nightbatch.results.lines.Tally adds it up.
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0

    def consistent(self) -> bool:
        return (len(self.custom_ids) == len(self.lengths) and sum(self.lengths) == self.size
                and len(set(self.failed)) == len(self.failed) and all(0 <= i < len(self.lengths) for i in self.failed)
                and (not self.numbers or len(self.numbers) == len(self.lengths)))

    def numbered(self) -> bool:
        """Its lines carry their input line numbers: what Finalize's input-order merge streams."""
        return bool(self.numbers) and len(self.numbers) == len(self.lengths)

    def ascending(self) -> list[tuple[int, int]]:
        """The stretches [lo, hi) of its lines whose numbers ascend: one, or two once an attempt's last lines
        were appended to it (gpu_worker.checkpoints)."""
        cuts = [i for i, (a, b) in enumerate(pairwise(self.numbers), start=1) if a >= b]
        return list(pairwise([0, *cuts, len(self.numbers)]))


_SUMMARY = msgspec.json.Decoder(CheckpointSummary)


def write_checkpoint_summary(blobs: BlobStore, checkpoint: str, summary: CheckpointSummary) -> None:
    blobs.put_bytes(checkpoint_summary_key(checkpoint), msgspec.json.encode(summary), content_type="application/json")


def read_checkpoint_summary(blobs: BlobStore, checkpoint: str) -> CheckpointSummary | None:
    """None when there is none, or none of a version this code reads: the caller parses instead."""
    raw = blobs.get_bytes(checkpoint_summary_key(checkpoint))
    try:
        return None if raw is None else _SUMMARY.decode(raw)
    except msgspec.MsgspecError:
        return None


def summarize_checkpoint(data: bytes, *, etag: str, numbers: list[int] | None = None) -> CheckpointSummary | None:
    """The summary the worker writes beside a checkpoint (nightbatch.results.lines.CheckpointSummary), made by reading
    its lines as Finalize's parsing path reads them, so both paths count alike. None when a line is not plain
    (blank, CR, over MAX_RESULT_LINE, or no newline at the end): such a checkpoint is left to that path.
    `numbers`: the input line number of each line, when the worker knows them (ascending)."""
    if not data.endswith(b"\n") or b"\r" in data or b"\n\n" in data or data.startswith(b"\n"):
        return None
    tally = Tally()
    ids: list[str] = []
    lengths: list[int] = []
    failed: list[int] = []
    for i, line in enumerate(data[:-1].split(b"\n")):
        if len(line) > MAX_RESULT_LINE:
            return None
        summary = summarize_result_line(line)
        ids.append(summary.custom_id)
        lengths.append(len(line) + 1)
        if summary.ok:
            tally.add_success(summary.usage)
        else:
            failed.append(i)
    return CheckpointSummary(size=len(data), etag=etag, custom_ids=ids, lengths=lengths, failed=failed,
                             numbers=numbers if numbers is not None and len(numbers) == len(ids) else [],
                             input_tokens=tally.input_tokens, cached_tokens=tally.cached_tokens,
                             output_tokens=tally.output_tokens, reasoning_tokens=tally.reasoning_tokens)


def join_summaries(head: CheckpointSummary, tail: CheckpointSummary, *, etag: str) -> CheckpointSummary:
    """The summary of checkpoint `head` once `tail`'s lines are appended to it (gpu_worker.checkpoints joins an
    attempt's small last lines to its previous checkpoint). Its numbers ascend in each of the two stretches."""
    n = len(head.lengths)
    return CheckpointSummary(
        size=head.size + tail.size, etag=etag, custom_ids=head.custom_ids + tail.custom_ids,
        lengths=head.lengths + tail.lengths, failed=head.failed + [n + i for i in tail.failed],
        numbers=head.numbers + tail.numbers if head.numbers and tail.numbers else [],
        input_tokens=head.input_tokens + tail.input_tokens, cached_tokens=head.cached_tokens + tail.cached_tokens,
        output_tokens=head.output_tokens + tail.output_tokens,
        reasoning_tokens=head.reasoning_tokens + tail.reasoning_tokens)


def _summarize_any(data: bytes) -> ResultSummary:
    line = loads(data)
    response = line.get("response")
    ok = response is not None and 200 <= int(response.get("status_code", 0)) < 300
    body = (response or {}).get("body") or {}
    code = (line.get("error") or {}).get("code") or ((body.get("error") or {}) if isinstance(body, dict) else {}
                                                     ).get("code")
    return ResultSummary(str(line["custom_id"]), ok, body.get("usage") or {} if ok else {}, None if ok else code)


@dataclass
class Tally:
    """Counts and usage recomputed from the lines written (docs/ARCHITECTURE.md, decision 1)."""

    completed: int = 0
    failed: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    models: set[str] = field(default_factory=set)
    unrun: dict[str, int] = field(default_factory=dict)  # Finalize's lines never run, by code (among `failed`)

    def add_summary(self, summary: CheckpointSummary) -> None:
        """Every line of a checkpoint, from its summary."""
        self.completed += len(summary.lengths) - len(summary.failed)
        self.failed += len(summary.failed)
        self.input_tokens += summary.input_tokens
        self.cached_tokens += summary.cached_tokens
        self.output_tokens += summary.output_tokens
        self.reasoning_tokens += summary.reasoning_tokens

    def subtract(self, other: Tally) -> None:
        self.completed -= other.completed
        self.failed -= other.failed
        self.input_tokens -= other.input_tokens
        self.cached_tokens -= other.cached_tokens
        self.output_tokens -= other.output_tokens
        self.reasoning_tokens -= other.reasoning_tokens

    def add_success(self, usage: dict[str, Any]) -> None:
        self.completed += 1
        if "input_tokens" in usage:  # a Responses object's usage has the batch's own field names
            self.input_tokens += int(usage.get("input_tokens") or 0)
            self.output_tokens += int(usage.get("output_tokens") or 0)
            self.cached_tokens += int((usage.get("input_tokens_details") or {}).get("cached_tokens") or 0)
            self.reasoning_tokens += int((usage.get("output_tokens_details") or {}).get("reasoning_tokens") or 0)
            return
        self.input_tokens += int(usage.get("prompt_tokens") or 0)
        self.output_tokens += int(usage.get("completion_tokens") or 0)
        details = usage.get("prompt_tokens_details") or {}
        self.cached_tokens += int(details.get("cached_tokens") or 0)
        out_details = usage.get("completion_tokens_details") or {}
        self.reasoning_tokens += int(out_details.get("reasoning_tokens") or 0)

    def usage(self) -> dict[str, Any]:
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": self.cached_tokens},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
            "total_tokens": self.input_tokens + self.output_tokens,
        }
