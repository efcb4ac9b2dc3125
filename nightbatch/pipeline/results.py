"""Result lines: the error lines for requests that never ran, and the tallies Finalize takes from the files."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from nightbatch.ids import batch_request_id, custom_id_digest
from nightbatch.jsonl import dumps_line, loads

UNRUN_MESSAGES = {
    "batch_cancelled": "This request was not executed because the batch was cancelled.",
    "batch_expired": "This request could not be executed before the completion window expired.",
    "shard_failed": "This request was not executed: its shard failed after all retries.",
}


# The longest result line Finalize reads back (and so the longest a worker may write): bounded memory per line.
MAX_RESULT_LINE = 64 * 1024 * 1024


def oversized_result_line(batch_id: str, custom_id: str, size: int) -> bytes:
    """What a worker writes instead of a result line over MAX_RESULT_LINE: that request's own error."""
    return dumps_line({
        "id": batch_request_id(batch_id, custom_id), "custom_id": custom_id, "response": None,
        "error": {"code": "result_too_large", "message": (
            f"The response to this request is {size} bytes, over the {MAX_RESULT_LINE}-byte limit of one "
            "result line; ask for fewer tokens, choices or inputs.")},
    })


def unrun_line(batch_id: str, custom_id: str, code: str) -> bytes:
    return dumps_line({
        "id": batch_request_id(batch_id, custom_id), "custom_id": custom_id, "response": None,
        "error": {"code": code, "message": UNRUN_MESSAGES[code]},
    })


class _Body(msgspec.Struct):
    usage: dict[str, Any] | None = None


class _Response(msgspec.Struct):
    status_code: int
    body: _Body | None = None


class _Line(msgspec.Struct):
    """The fields Finalize needs from a result line; msgspec skips the rest without building it."""

    custom_id: str
    response: _Response | None = None


_decode_line = msgspec.json.Decoder(_Line).decode


@dataclass(frozen=True)
class ResultSummary:
    custom_id: str
    ok: bool
    usage: dict[str, Any]


def summarize_result_line(data: bytes) -> ResultSummary:
    """custom_id, success and usage of one result line, decoding only those fields."""
    try:
        line = _decode_line(data)
    except msgspec.MsgspecError:
        return _summarize_any(data)  # not shaped as our workers write it: the general path decides
    r = line.response
    ok = r is not None and 200 <= r.status_code < 300
    usage = (r.body.usage if r is not None and r.body is not None else None) or {}
    return ResultSummary(line.custom_id, ok, usage if ok else {})


class _Details(msgspec.Struct, gc=False):
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None


class _Usage(msgspec.Struct, gc=False):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: _Details | None = None
    completion_tokens_details: _Details | None = None
    input_tokens: int | msgspec.UnsetType | None = msgspec.UNSET  # present: a Responses object's usage
    output_tokens: int | None = None
    input_tokens_details: _Details | None = None
    output_tokens_details: _Details | None = None


class _PlainBody(msgspec.Struct, gc=False):
    usage: _Usage | None = None


class _PlainResponse(msgspec.Struct, gc=False):
    status_code: int
    body: _PlainBody | None = None


class _PlainLine(msgspec.Struct, gc=False):  # no cycles: not tracked by the GC
    custom_id: str
    response: _PlainResponse


_decode_plain = msgspec.json.Decoder(_PlainLine).decode


def tally_plain_lines(piece: bytes, seen: set[int], tally: Tally) -> int:
    """Counts a run of result lines that all go to the output as they are, in bulk: every line `\n`-ended
    (no CR, none blank), a successful response with integer usage, its custom_id new. Returns how many
    lines were counted, or 0 (nothing counted, `seen` untouched) when any line needs the line-by-line path."""
    if not piece.endswith(b"\n") or b"\r" in piece or b"\n\n" in piece or piece.startswith(b"\n"):
        return 0
    try:
        lines = [_decode_plain(raw) for raw in piece[:-1].split(b"\n")]
    except msgspec.MsgspecError:
        return 0
    digests = {custom_id_digest(line.custom_id) for line in lines}
    if len(digests) != len(lines) or not digests.isdisjoint(seen):
        return 0
    sums = [0, 0, 0, 0]  # input, output, cached, reasoning
    for line in lines:
        r = line.response
        if not 200 <= r.status_code < 300:
            return 0
        u = r.body.usage if r.body is not None else None
        if u is None:
            continue
        if u.input_tokens is not msgspec.UNSET:  # as Tally.add_success reads a Responses usage
            sums[0] += u.input_tokens or 0
            sums[1] += u.output_tokens or 0
            sums[2] += (u.input_tokens_details.cached_tokens or 0) if u.input_tokens_details else 0
            sums[3] += (u.output_tokens_details.reasoning_tokens or 0) if u.output_tokens_details else 0
        else:
            sums[0] += u.prompt_tokens or 0
            sums[1] += u.completion_tokens or 0
            sums[2] += (u.prompt_tokens_details.cached_tokens or 0) if u.prompt_tokens_details else 0
            sums[3] += (u.completion_tokens_details.reasoning_tokens or 0) if u.completion_tokens_details else 0
    seen |= digests
    tally.completed += len(lines)
    tally.input_tokens += sums[0]
    tally.output_tokens += sums[1]
    tally.cached_tokens += sums[2]
    tally.reasoning_tokens += sums[3]
    return len(lines)


def _summarize_any(data: bytes) -> ResultSummary:
    line = loads(data)
    response = line.get("response")
    ok = response is not None and 200 <= int(response.get("status_code", 0)) < 300
    body = (response or {}).get("body") or {}
    return ResultSummary(str(line["custom_id"]), ok, body.get("usage") or {} if ok else {})


@dataclass
class Tally:
    """Counts and usage recomputed from the lines written (ARCHITECTURE decision 1)."""

    completed: int = 0
    failed: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    models: set[str] = field(default_factory=set)

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
