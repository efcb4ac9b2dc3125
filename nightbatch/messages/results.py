"""The results of a Message Batch: Anthropic's result lines, made line by line from our output and error files as
they stream (bounded memory: one line at a time).

Served as a File's bytes are (nightbatch/files/downloads.py): the lines are written once, by Finalize as it ends
the batch, into an object of their own (layout.message_results_key), which the API streams inline up to
`max_inline_download_bytes` and past that hands out as a 307 to a pre-signed URL (an API Lambda's response
carries ~6 MB). A batch that ended without one (refused at Validate, failed by Finalize, or finalized by
0.1.x) has it written by its first results request. Once a file the lines were made from has expired
or been deleted, the lines of what is left are made afresh, as the object no longer says what the batch has.

Our line -> Anthropic's `result`: a 2xx response -> `succeeded` with the engine's Message; another response ->
`errored` with Anthropic's error object for its status; Finalize's unrun lines -> `canceled` (batch_cancelled),
`expired` (batch_expired), else `errored` (shard_failed, result_too_large: api_error). Lines come in the files'
order, succeeded first; Anthropic does not promise request order either (match on `custom_id`). A batch whose
input was refused as a whole (`failed`) gives every request `errored` with the reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from nightbatch import layout
from nightbatch.aws.records import BatchRecord
from nightbatch.errors import NotFoundError
from nightbatch.files.downloads import Redirect, locate_object
from nightbatch.jsonl import UndecodableLine, dumps, loads, split_lines
from nightbatch.messages.errors import error_body
from nightbatch.messages.objects import wire_id
from nightbatch.results.lines import MAX_RESULT_LINE
from nightbatch.wiring import Services

UNRUN_RESULTS = {"batch_cancelled": "canceled", "batch_expired": "expired"}


def result_of(line: dict[str, Any]) -> dict[str, Any]:
    """Anthropic's `result` for one of our result lines (nightbatch.results.lines.RequestOutput, decoded)."""
    response = line.get("response")
    if isinstance(response, dict):
        status = int(response.get("status_code") or 500)
        body = response.get("body")
        if 200 <= status < 300:
            return {"type": "succeeded", "message": body}
        err = body.get("error") if isinstance(body, dict) else None
        message = err.get("message") if isinstance(err, dict) else None
        return errored(status, str(message or f"The request failed ({status})."))
    error = line.get("error") or {}
    code = error.get("code")
    if code in UNRUN_RESULTS:
        return {"type": UNRUN_RESULTS[code]}
    return errored(500, str(error.get("message") or "The request failed."))


def errored(status: int, message: str) -> dict[str, Any]:
    """Anthropic's `errored` result: the error object its API would have answered the request with."""
    return {"type": "errored", "error": error_body(status, message)}


def convert_line(data: bytes) -> bytes:
    line = loads(data)
    return dumps({"custom_id": line["custom_id"], "result": result_of(line)}) + b"\n"


def serve(services: Services, rec: BatchRecord) -> Redirect | Iterator[bytes]:
    """The ended batch's results: a redirect past the inline limit, else the bytes."""
    if not all(_live(services, rec, file_id) for file_id in _sources(rec)):
        return result_lines(services, rec)
    blobs = services.adapters.blobs
    key = layout.message_results_key(rec.pk)
    size = blobs.size(key)
    if size is None:
        size = write_results(services, rec)
    target = locate_object(services.settings, blobs, key, size, f"{wire_id(rec.pk)}_results.jsonl")
    return target if target is not None else blobs.iter_chunks(key)


def write_results(services: Services, rec: BatchRecord) -> int:
    """Writes the results object of `rec` (ended, or about to be with these files: Finalize); its size. The same
    batch writes the same bytes, so a second writer (a Finalize re-run, two first requests) changes nothing."""
    writer = services.adapters.blobs.writer(layout.message_results_key(rec.pk))
    try:
        writer.write_lines(result_lines(services, rec))
        return writer.close()
    except BaseException:
        writer.abort()
        raise


def result_lines(services: Services, rec: BatchRecord) -> Iterator[bytes]:
    """Every request's result line, once (one line per request in the files: docs/ARCHITECTURE.md, decision 3)."""
    if rec.status == "failed":
        yield from _refused(services, rec)
        return
    for file_id in _sources(rec):
        for _, data in _lines(services, rec, file_id):
            yield convert_line(data)


def _sources(rec: BatchRecord) -> list[str]:
    """The files the result lines are made from: the input's lines of a batch refused as a whole, else the
    output and error files."""
    ids = [rec.input_file_id] if rec.status == "failed" else [rec.output_file_id, rec.error_file_id]
    return [file_id for file_id in ids if file_id]


def _live(services: Services, rec: BatchRecord, file_id: str) -> bool:
    try:
        services.files.item(rec.tenant, file_id)
    except NotFoundError:
        return False
    return True


def _refused(services: Services, rec: BatchRecord) -> Iterator[bytes]:
    errors = (rec.errors or {}).get("data") or [{}]
    by_line = {e.get("line"): e.get("message") for e in errors if e.get("line") is not None}
    general = str(errors[0].get("message") or "The batch could not be run.")
    for number, data in _lines(services, rec, rec.input_file_id):
        try:
            custom_id = loads(data).get("custom_id")
        except (UndecodableLine, AttributeError):
            custom_id = None  # the line itself is what was refused (its error names it by number)
        message = by_line.get(number, general)
        yield dumps({"custom_id": custom_id, "result": errored(400, message)}) + b"\n"


def _lines(services: Services, rec: BatchRecord, file_id: str | None) -> Iterator[tuple[int, bytes]]:
    """(line number as Validate counts it, blank lines included; the line) of each non-blank line."""
    if file_id is None:
        return
    try:
        item = services.files.item(rec.tenant, file_id)
    except NotFoundError:
        return  # expired with its bytes (files expire; a batch's results with them)
    for raw in split_lines(services.files.chunks(item), max_bytes=MAX_RESULT_LINE):
        if raw.data is not None and raw.data.strip():
            yield raw.number, raw.data
