"""The `nightbatch` options of a batch (`extra_body={"nightbatch": {...}}`): known keys only, and small.

They are stored in the batch item, which every later status update rewrites; DynamoDB refuses an item over
400 KB, so an unbounded object would make the batch impossible to finish (and, before the sweeper isolated
batches, stall every other batch too). Add a key here when a feature reads it.
"""

from __future__ import annotations

import json
from typing import Any

from nightbatch.errors import InvalidRequestError
from nightbatch.files.user_buckets import check_uri_options
from nightbatch.notifications.email import check_notify_options
from nightbatch.settings import Settings

# Option -> the keys allowed inside it (None: a scalar or list value, not an object).
ALLOWED: dict[str, frozenset[str] | None] = {
    "notify": frozenset({"email"}),
    "input_uri": None,  # s3://bucket/key or prefix/ read in place instead of input_file_id (files/user_buckets.py)
    "output_uri": None,  # s3://bucket/prefix/ the output and error files are copied under
}
MAX_OPTIONS_BYTES = 4096


def check_options(options: dict[str, Any] | None, settings: Settings) -> None:
    """400 for an unknown key, an oversized object, or a bad e-mail option (checked at batch create)."""
    if not options:
        return
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
    check_uri_options(options, settings)
