"""Structured logs: one JSON object per line, with request and batch ids, and never a key, secret or body.

`configure_logging()` installs the formatter on the root logger (the Lambda entry points and the workers call
it). `log_context(request_id=…, batch_id=…)` binds ids for everything logged in the current context; ids
passed with `extra=` win. Attributes that may hold secrets or user content are dropped by name, and anything
that looks like an API key, a bearer token, a webhook secret or a link signature is masked in messages and tracebacks.
In a traced Lambda invocation each line also carries `xray_trace_id` (as Powertools' Logger does), so that a
trace in X-Ray leads to its log lines and back.

Powertools' Logger is not used: it formats its own logger and copies its handler only to the loggers registered
when asked, while this formatter on the root logger also catches loggers made later and third-party ones, and the
worker and the CLI (which do not ship Powertools) log through the same code.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TextIO

_EMPTY: dict[str, str] = {}
# The default is never mutated: `bind` always sets a fresh dict.
_context: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar("nb_log_context", default=_EMPTY)

# Never emitted, whatever a caller passes in `extra=`.
DENIED_FIELDS = frozenset({
    "authorization", "api_key", "apikey", "key", "secret", "signing_secret", "password", "token", "headers",
    "body", "content", "data", "request_body", "response_body", "messages", "prompt", "input", "cookie",
})
_SECRET_PATTERNS = (
    (re.compile(r"nb-[A-Za-z0-9_\-]{8,}"), "nb-***"),
    (re.compile(r"(?i)(bearer\s+)[^\s\"',]+"), r"\1***"),
    (re.compile(r"whsec_[A-Za-z0-9+/=]{8,}"), "whsec_***"),
    (re.compile(r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?)[^\"',}\s]+"), r"\1***"),
    # Signed download links (nightbatch.files.links) and pre-signed S3 URLs: the signature is the credential.
    (re.compile(r"(?i)([?&](?:sig|x-amz-signature|x-amz-security-token|signature)=)[^&\s\"'<>]+"), r"\1***"),
)
# Attributes every LogRecord has; anything else on a record came from `extra=`.
_RECORD_ATTRS = frozenset(vars(logging.LogRecord("x", 0, "x", 0, "x", None, None))) | {"message", "asctime"}


def xray_trace_id() -> str | None:
    """The current Lambda invocation's X-Ray trace id (the runtime sets `_X_AMZN_TRACE_ID` per invocation)."""
    root = os.environ.get("_X_AMZN_TRACE_ID", "").partition("Root=")[2].partition(";")[0]
    return root or None


def scrub(text: str) -> str:
    for pattern, replacement in _SECRET_PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def bind(**fields: str | None) -> contextvars.Token[dict[str, str]]:
    """Adds fields to the log context of the current task/thread; returns a token for `unbind`."""
    merged = dict(_context.get())
    merged.update({k: v for k, v in fields.items() if v is not None})
    return _context.set(merged)


def unbind(token: contextvars.Token[dict[str, str]]) -> None:
    _context.reset(token)


@contextmanager
def log_context(**fields: str | None) -> Iterator[None]:
    token = bind(**fields)
    try:
        yield
    finally:
        unbind(token)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": scrub(record.getMessage()),
        }
        trace_id = xray_trace_id()
        if trace_id:
            out["xray_trace_id"] = trace_id
        out.update(_context.get())
        for name, value in vars(record).items():
            if name in _RECORD_ATTRS or name.startswith("_") or name.lower() in DENIED_FIELDS:
                continue
            out[name] = value if isinstance(value, int | float | bool) or value is None else scrub(str(value))
        if record.exc_info:
            out["exception"] = scrub(self.formatException(record.exc_info))
        return json.dumps(out, ensure_ascii=False, default=str)


def configure_logging(level: int | str = logging.INFO, stream: TextIO | None = None) -> None:
    """JSON lines on stderr from the root logger (replacing handlers a runtime may have installed)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
