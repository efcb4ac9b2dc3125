"""A batch create request and every check it passes before the batch is written, in the order they answer.

Each problem is answered with OpenAI's own wording (code, message, param), hence the loosely typed request.
The checks whose noun lives elsewhere stay there, because other requests use them too, and are called from
here: `errors.check_supported`, the files' `check_expiry_seconds` (file and Upload expiry), the e-mail
address rules of `batches/recipients.py` (the Notify step's recipients at send time).

The `nightbatch` options (`extra_body={"nightbatch": {...}}`) are known keys only, and small: they are stored
in the batch item, which every later status update rewrites; DynamoDB refuses an item over 400 KB, so an
unbounded object would make the batch impossible to finish (and, before the sweeper isolated batches, stall
every other batch too). Add a key to ALLOWED when a feature reads it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from nightbatch.batches.recipients import check_notify_options
from nightbatch.errors import InvalidRequestError, NotFoundError, check_supported
from nightbatch.files.service import FileService, check_expiry_seconds
from nightbatch.files.user_buckets import BatchUris, check_uri_options
from nightbatch.models.spec import ENDPOINTS, MESSAGES_ENDPOINT
from nightbatch.settings import Settings
from nightbatch.tenancy.scope import Scope

WINDOW_RE = re.compile(r"^([1-9][0-9]{0,2})h$")
# Option -> the keys allowed inside it (None: a scalar or list value, not an object).
ALLOWED: dict[str, frozenset[str] | None] = {
    "notify": frozenset({"email"}),
    "input_uri": None,  # s3://bucket/key or prefix/ read in place instead of input_file_id (files/user_buckets.py)
    "output_uri": None,  # s3://bucket/prefix/ the output and error files are copied under
    "output_order": None,  # "completion" (default) or "input": the output file's line order
}
OUTPUT_ORDERS = ("completion", "input")
MAX_OPTIONS_BYTES = 4096


class ExpiresAfter(BaseModel):
    anchor: str = "created_at"
    seconds: int


class CreateBatchRequest(BaseModel):
    """Loosely typed so that the checks can answer each problem with OpenAI's own wording."""

    input_file_id: str = ""  # or `nightbatch.input_uri` (nightbatch/files/user_buckets.py)
    endpoint: str
    completion_window: str
    metadata: dict[str, Any] | None = None
    output_expires_after: ExpiresAfter | None = None
    nightbatch: dict[str, Any] | None = None


@dataclass(frozen=True)
class CheckedCreate:
    """What the checks of a create request found: its completion window in hours, and its URIs parsed."""

    hours: int
    uris: BatchUris


def check_create(tenant: str, req: CreateBatchRequest, *, settings: Settings, files: FileService,
                 wire: str = "openai") -> CheckedCreate:
    """400 for the first problem of a create request."""
    # The Anthropic wire's batches run Messages lines, which OpenAI's POST /v1/batches does not take.
    check_supported(req.endpoint, ENDPOINTS if wire == "openai" else (MESSAGES_ENDPOINT,), param="endpoint")
    hours = window_hours(req.completion_window, settings.validation.max_completion_window_hours)
    check_metadata(req.metadata)
    # Known keys only, a few KB at most; a bad e-mail address is a 400 now rather than a dropped e-mail later.
    uris = check_options(req.nightbatch, settings, Scope.of(settings, tenant))
    if req.output_expires_after is not None:
        check_supported(req.output_expires_after.anchor, ("created_at",), param="output_expires_after.anchor")
        check_expiry_seconds(req.output_expires_after.seconds, "output_expires_after.seconds")
    if "input_uri" in (req.nightbatch or {}):  # the batch's file is made over the URI's objects at create
        if req.input_file_id:
            raise InvalidRequestError("Give 'input_file_id' or 'nightbatch.input_uri', not both.",
                                      param="nightbatch.input_uri", code="invalid_value")
    elif not req.input_file_id:
        raise InvalidRequestError("Missing required parameter: 'input_file_id'.", param="input_file_id",
                                  code="missing_required_parameter")
    else:
        check_input_file(files, tenant, req.input_file_id)
    return CheckedCreate(hours, uris)


def window_hours(window: str, max_hours: int) -> int:
    m = WINDOW_RE.fullmatch(window)
    hours = int(m.group(1)) if m else 0
    if not 1 <= hours <= max_hours:
        raise InvalidRequestError(
            f"Invalid value: '{window}'. 'completion_window' must be a number of hours between 1h and "
            f"{max_hours}h, such as '24h' or '72h'.",
            param="completion_window", code="invalid_value",
        )
    return hours


def check_metadata(metadata: dict[str, Any] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > 16:
        raise InvalidRequestError(
            f"Invalid 'metadata': too many keys ({len(metadata)}). Expected at most 16 key-value pairs.",
            param="metadata", code="invalid_value",
        )
    for k, v in metadata.items():
        if len(k) > 64:
            raise InvalidRequestError(
                f"Invalid 'metadata': key '{k[:64]}…' is longer than 64 characters.",
                param=f"metadata.{k[:64]}", code="invalid_value",
            )
        if not isinstance(v, str):
            raise InvalidRequestError(
                f"Invalid type for 'metadata.{k}': expected a string, but got {_json_type(v)} instead.",
                param=f"metadata.{k}", code="invalid_type",
            )
        if len(v) > 512:
            raise InvalidRequestError(
                f"Invalid 'metadata.{k}': string too long. Expected a string with maximum length 512, "
                f"but got a string with length {len(v)} instead.",
                param=f"metadata.{k}", code="invalid_value",
            )


def _json_type(v: Any) -> str:
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int | float):
        return "a number"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, dict):
        return "an object"
    return "null" if v is None else "a value"


def check_options(options: dict[str, Any] | None, settings: Settings, scope: Scope) -> BatchUris:
    """400 for an unknown key, an oversized object, a bad e-mail option, or a URI outside the tenant's scope;
    returns the URIs parsed."""
    if not options:
        return BatchUris()
    for key, value in options.items():
        if key not in ALLOWED:
            raise InvalidRequestError(
                f"Unrecognized option 'nightbatch.{key[:64]}'. Known options: "
                + ", ".join(f"'{k}'" for k in sorted(ALLOWED)) + ".",
                param=f"nightbatch.{key[:64]}", code="unknown_parameter")
        inner = ALLOWED[key]
        if inner is not None:
            if not isinstance(value, dict):
                raise InvalidRequestError(f"Invalid type for 'nightbatch.{key}': expected an object.",
                                          param=f"nightbatch.{key}", code="invalid_type")
            for sub in value:
                if sub not in inner:
                    raise InvalidRequestError(
                        f"Unrecognized option 'nightbatch.{key}.{str(sub)[:64]}'. Known: "
                        + ", ".join(f"'{k}'" for k in sorted(inner)) + ".",
                        param=f"nightbatch.{key}.{str(sub)[:64]}", code="unknown_parameter")
    size = len(json.dumps(options, separators=(",", ":"), default=str).encode())
    if size > MAX_OPTIONS_BYTES:
        raise InvalidRequestError(
            f"Invalid 'nightbatch': the options take {size} bytes; at most {MAX_OPTIONS_BYTES} are allowed.",
            param="nightbatch", code="invalid_value")
    check_notify_options(options, settings)
    uris = check_uri_options(options, scope)
    if "output_order" in options and options["output_order"] not in OUTPUT_ORDERS:
        raise InvalidRequestError(
            f"Invalid 'nightbatch.output_order': {json.dumps(options['output_order'], default=str)[:64]}. "
            "Expected one of " + ", ".join(f"'{v}'" for v in OUTPUT_ORDERS) + ".",
            param="nightbatch.output_order", code="invalid_value")
    return uris


def check_input_file(files: FileService, tenant: str, file_id: str) -> None:
    # docs/ARCHITECTURE.md, decision 10: missing, another tenant's, or not purpose=batch -> one answer.
    try:
        f = files.get(tenant, file_id)
        ok = f.purpose == "batch" and f.status != "error"  # "error": an upload that failed its md5 check
    except NotFoundError:
        ok = False
    if ok and f.status != "processed":
        # Only a fully processed file: "uploaded" is an Upload whose md5 is still being checked.
        raise InvalidRequestError(
            f"Invalid 'input_file_id': '{file_id}'. The file is still being processed (status "
            f"'{f.status}'); create the batch once its status is 'processed'.",
            param="input_file_id", code="file_not_ready")
    if not ok:
        raise InvalidRequestError(
            f"Invalid 'input_file_id': '{file_id}'. The file does not exist or was not uploaded "
            "with purpose 'batch'.",
            param="input_file_id", code="invalid_value",
        )
