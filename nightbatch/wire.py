"""Wire models with OpenAI's field names: FileObject, Batch, Model, Upload, list envelopes. A result line's one
type and encoder: nightbatch/results/lines.py."""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, Field

BatchStatus = Literal[
    "validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"
]
TERMINAL_STATUSES: frozenset[str] = frozenset({"failed", "completed", "expired", "cancelled"})


class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: Literal["uploaded", "processed", "error"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class DeletedFile(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


class BatchError(BaseModel):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchError]


class RequestCounts(BaseModel):
    total: int = 0
    completed: int = 0
    failed: int = 0


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class Usage(BaseModel):
    input_tokens: int = 0
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int = 0
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int = 0


class Batch(BaseModel):
    """Every field is always present; unset ones are null (docs/ARCHITECTURE.md "The OpenAI wire contract", point 2)."""

    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    model: str | None = None
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts = Field(default_factory=RequestCounts)
    usage: Usage | None = None
    metadata: dict[str, str] | None = None
    # Our additions live under one key (docs/ARCHITECTURE.md, decision 7).
    nightbatch: dict[str, Any] | None = None


T = TypeVar("T")


class ListPage(BaseModel, Generic[T]):
    object: Literal["list"] = "list"
    data: list[T]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


def list_page(data: list[T], has_more: bool) -> ListPage[T]:
    return ListPage(data=data, has_more=has_more, first_id=getattr(data[0], "id", None) if data else None,
                    last_id=getattr(data[-1], "id", None) if data else None)


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "nightbatch"
    # Our addition (docs/ARCHITECTURE.md, decision 7): {"task": "generate" | "embed" | "score", "endpoints":
    # [...]} — what `nightbatch doctor` probes.
    nightbatch: dict[str, Any] | None = None


UploadStatus = Literal["pending", "completed", "cancelled", "expired"]


class Upload(BaseModel):
    """docs/ARCHITECTURE.md "The OpenAI wire contract", point 3: `file` is set only once the Upload is completed."""

    id: str
    object: Literal["upload"] = "upload"
    bytes: int
    created_at: int
    expires_at: int
    filename: str
    purpose: str
    status: UploadStatus
    file: FileObject | None = None


class UploadPart(BaseModel):
    id: str
    object: Literal["upload.part"] = "upload.part"
    created_at: int
    upload_id: str
