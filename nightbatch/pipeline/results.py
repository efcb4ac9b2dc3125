"""Result lines: the error lines for requests that never ran, and the tallies Finalize takes from the files."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from nightbatch.ids import batch_request_id
from nightbatch.jsonl import dumps_line

UNRUN_MESSAGES = {
    "batch_cancelled": "This request was not executed because the batch was cancelled.",
    "batch_expired": "This request could not be executed before the completion window expired.",
    "shard_failed": "This request was not executed: its shard failed after all retries.",
}


def unrun_line(batch_id: str, custom_id: str, code: str) -> bytes:
    return dumps_line({
        "id": batch_request_id(batch_id, custom_id), "custom_id": custom_id, "response": None,
        "error": {"code": code, "message": UNRUN_MESSAGES[code]},
    })


# Our workers write `{"id":…,"custom_id":…,"response":{"status_code":N,…` in this key order; a line that
# doesn't match (written by anything else) is parsed in full instead.
_HEAD = re.compile(r'^\{"id":"[^"\\]*","custom_id":("(?:[^"\\]|\\.)*"),"response":(?:null|\{"status_code":(\d+))')
_USAGE = '"usage":{'
_decoder = json.JSONDecoder()


@dataclass(frozen=True)
class ResultSummary:
    custom_id: str
    ok: bool
    usage: dict[str, Any]


def summarize_result_line(data: bytes) -> ResultSummary:
    """custom_id, success and usage of one result line without parsing the whole response body."""
    text = data.decode()
    m = _HEAD.match(text)
    if m is None:
        line = json.loads(text)
        response = line.get("response")
        ok = response is not None and 200 <= int(response.get("status_code", 0)) < 300
        body = (response or {}).get("body") or {}
        return ResultSummary(str(line["custom_id"]), ok, body.get("usage") or {} if ok else {})
    quoted = m.group(1)
    custom_id = json.loads(quoted) if "\\" in quoted else quoted[1:-1]
    ok = m.group(2) is not None and 200 <= int(m.group(2)) < 300
    usage: dict[str, Any] = {}
    if ok:
        # An unescaped `"usage":{` can only be a key (quotes inside strings are escaped); the body's own
        # usage is the last one.
        at = text.rfind(_USAGE)
        if at >= 0:
            usage, _ = _decoder.raw_decode(text, at + len(_USAGE) - 1)
    return ResultSummary(custom_id, ok, usage)


def digest(custom_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(custom_id.encode(), digest_size=8).digest(), "big")


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
