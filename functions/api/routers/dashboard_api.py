"""Tenant-scoped reads for the dashboard's batch page: its shards and progress, and a bounded file preview."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query

from functions.api.deps import PrincipalDep, ServicesDep
from nightbatch.errors import InvalidRequestError
from nightbatch.results.detail import batch_detail
from nightbatch.results.partial import partial_results

router = APIRouter(prefix="/v1/nightbatch", tags=["nightbatch"])

MAX_PREVIEW_LINES = 50
# A preview never reads more than this much of a file, however long its lines.
PREVIEW_BYTES = 256 * 1024


@router.get("/batches/{batch_id}/detail")
def get_batch_detail(batch_id: str, principal: PrincipalDep, services: ServicesDep) -> dict[str, Any]:
    return batch_detail(services, principal.tenant, batch_id)


@router.get("/batches/{batch_id}/preview")
def preview_partial_results(
    batch_id: str, principal: PrincipalDep, services: ServicesDep, kind: str = "output",
    lines: Annotated[int, Query()] = 10,
) -> dict[str, Any]:
    """The first `lines` result lines finished so far of a running batch (nightbatch.results.partial), shaped
    as a file preview; a bounded read of the checkpoints."""
    _check_lines(lines)
    found = partial_results(services, principal.tenant, batch_id, kind, scan_bytes=PREVIEW_BYTES)
    out: list[dict[str, Any]] = []
    for data in found.lines:
        out.append({"line": len(out) + 1, "json": json.loads(data)})
        if len(out) == lines:
            break
    close = getattr(found.lines, "close", None)
    if close is not None:
        close()
    return {"object": "nightbatch.results_preview", "batch_id": batch_id, "kind": kind, "status": found.status,
            "complete": found.complete, "count": found.count, "lines": out}


def _check_lines(lines: int) -> None:
    if not 1 <= lines <= MAX_PREVIEW_LINES:
        raise InvalidRequestError(
            f"Invalid 'lines': {lines}. Expected a value between 1 and {MAX_PREVIEW_LINES}.",
            param="lines", code="invalid_value",
        )


@router.get("/files/{file_id}/preview")
def preview_file(
    file_id: str, principal: PrincipalDep, services: ServicesDep, lines: Annotated[int, Query()] = 10,
) -> dict[str, Any]:
    """The first `lines` lines of a file, each parsed when it is JSON; a bounded read, never the whole file."""
    _check_lines(lines)
    item = services.files.item(principal.tenant, file_id)
    buf = b""
    read = 0
    chunks = services.files.chunks(item)
    try:
        for chunk in chunks:
            buf += chunk
            read += len(chunk)
            if buf.count(b"\n") >= lines or read >= PREVIEW_BYTES:
                break
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()  # releases the S3 body early
    complete = read >= item.bytes
    parts = buf.split(b"\n")
    out: list[dict[str, Any]] = []
    for i, line in enumerate(parts[:lines]):
        if not line.strip():
            continue
        # The read stopped inside this line (a very long one): show its start, marked as cut.
        cut = not complete and i == len(parts) - 1
        entry: dict[str, Any] = {"line": i + 1}
        text = line.decode("utf-8", errors="replace")
        try:
            entry["json"] = None if cut else json.loads(line)
        except ValueError:
            entry["json"] = None
        if entry["json"] is None:
            entry.update(text=text, truncated=cut)
        out.append(entry)
    shown = sum(len(x) + 1 for x in parts[:lines])
    return {"object": "nightbatch.file_preview", "file_id": file_id, "bytes": item.bytes, "lines": out,
            "has_more": shown < item.bytes}
