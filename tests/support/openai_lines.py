"""OpenAI's output and error line (the Batch API's `BatchRequestOutput`), as the tests' own model of it: every line
the product writes (nightbatch/results/lines.py) must parse as one."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class ResponseEnvelope(BaseModel):
    status_code: int
    request_id: str
    body: dict[str, Any]


class LineError(BaseModel):
    code: str
    message: str


class BatchRequestOutput(BaseModel):
    id: str
    custom_id: str
    response: ResponseEnvelope | None
    error: LineError | None
