"""Validation of batch input lines: stable codes, 1-based line numbers, OpenAI's wording where it has one."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import msgspec

from nightbatch.settings import Settings
from nightbatch.wire import BatchError

MAX_CUSTOM_ID = 512
_decode = msgspec.json.Decoder().decode
MAX_ECHO = 64
# A batch's stored `errors` stop growing here (besides max_reported_errors), so 100 failed batches in one list
# response stay far under the ~6 MB a Lambda may answer, and the batch item under DynamoDB's 400 KB.
MAX_ERRORS_BYTES = 32 * 1024


class LineInvalid(Exception):
    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.error = (code, message, param)


@dataclass
class ValidRequest:
    number: int
    custom_id: str
    body: dict[str, Any]
    est_tokens: int
    raw: bytes


@dataclass
class Validator:
    """Checks one line at a time; keeps only a fixed-size digest per custom_id (ARCHITECTURE decision 2)."""

    settings: Settings
    endpoint: str
    model: str | None = None
    seen: set[int] = field(default_factory=set)
    embedding_inputs: int = 0

    def check(self, number: int, data: bytes | None, size: int) -> ValidRequest:
        s = self.settings
        if data is None:
            raise LineInvalid("line_too_long", f"Line {number} is {size} bytes, over the limit of "
                              f"{s.max_line_bytes} bytes per line.")
        try:
            # Compiled fast path: a line it parses is valid UTF-8 (bytes outside strings can only be JSON
            # syntax) and means what json.loads says it means.
            obj = _decode(data)
        except msgspec.MsgspecError:
            obj = _stdlib_parse(number, data)
        if not isinstance(obj, dict):
            raise LineInvalid("invalid_json_line", "This line is not a JSON object.")
        for name in ("custom_id", "method", "url", "body"):
            if name not in obj:
                raise LineInvalid("missing_required_parameter", f"Missing required parameter: '{name}'.", name)
        custom_id = obj["custom_id"]
        if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID:
            raise LineInvalid("invalid_request", f"'custom_id' must be a non-empty string of at most "
                              f"{MAX_CUSTOM_ID} characters.", "custom_id")
        if obj["method"] != "POST":
            raise LineInvalid("invalid_method", f"Invalid method {echo(obj['method'])}: only 'POST' is supported.",
                              "method")
        if obj["url"] != self.endpoint:
            raise LineInvalid("invalid_url", "The URL provided for this request does not match the batch "
                              f"endpoint '{self.endpoint}'.", "url")
        body = obj["body"]
        if not isinstance(body, dict):
            raise LineInvalid("invalid_request", "'body' must be a JSON object.", "body")
        est = self._check_body(body, len(data))
        digest = int.from_bytes(hashlib.blake2b(custom_id.encode(), digest_size=8).digest(), "big")
        if digest in self.seen:
            raise LineInvalid("duplicate_custom_id", f"The custom_id '{custom_id}' for this request is a "
                              "duplicate of another request. The custom_id parameter must be unique for each "
                              "request in a batch.", "custom_id")
        self.seen.add(digest)
        return ValidRequest(number, custom_id, body, est, data)

    def _check_body(self, body: dict[str, Any], line_bytes: int) -> int:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise LineInvalid("invalid_request", "Model parameter is required.", "body.model")
        spec = self.settings.model(model)
        if spec is None or self.endpoint not in spec.endpoints:
            served = ", ".join(m.name for m in self.settings.models if self.endpoint in m.endpoints)
            raise LineInvalid("model_not_found", f"The provided model {echo(model)} is not supported by the Batch "
                              f"API for {self.endpoint}. Served models: {served or 'none'}.", "body.model")
        if self.model is None:
            self.model = model
        elif model != self.model:
            raise LineInvalid("mismatched_model", f"The model {echo(model)} for this request does not match the "
                              "rest of the batch. Each batch must contain requests for a single model.",
                              "body.model")
        if body.get("stream"):
            raise LineInvalid("streaming_unsupported", "Streaming is not supported in the Batch API.",
                              "body.stream")
        max_out = body.get("max_completion_tokens", body.get("max_tokens"))
        out = max_out if isinstance(max_out, int) and max_out > 0 else self.settings.default_max_tokens
        if self.endpoint == "/v1/chat/completions":
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise LineInvalid("invalid_request", "Messages parameter is required.", "body.messages")
            return _estimate(line_bytes) + out
        if self.endpoint == "/v1/completions":
            if "prompt" not in body:
                raise LineInvalid("invalid_request", "Prompt parameter is required.", "body.prompt")
            return _estimate(line_bytes) + out
        inputs = body.get("input")
        if inputs is None or inputs == "" or inputs == []:
            raise LineInvalid("invalid_request", "Input parameter is required.", "body.input")
        n = len(inputs) if isinstance(inputs, list) and inputs and not isinstance(inputs[0], int) else 1
        self.embedding_inputs += n
        if self.embedding_inputs > self.settings.max_embedding_inputs:
            raise LineInvalid("too_many_inputs", f"The batch has more than {self.settings.max_embedding_inputs}"
                              " embedding inputs across its requests.", "body.input")
        return _estimate(line_bytes)


def _stdlib_parse(number: int, data: bytes) -> Any:
    """What the standard library accepts (NaN, 1e400, lone surrogates) and its errors, as before msgspec."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise LineInvalid("invalid_encoding", f"Line {number} is not valid UTF-8 (byte {e.start}).") from e
    try:
        return json.loads(text)
    except ValueError as e:
        raise LineInvalid("invalid_json_line", "This line is not parseable as valid JSON.") from e
    except RecursionError:
        # `[[[[…` a few thousand deep: the parser's recursion limit, one bad line rather than a crashed step.
        raise LineInvalid("invalid_json_line", "This line nests JSON too deeply to be parsed.") from None


def echo(value: Any, limit: int = MAX_ECHO) -> str:
    """A user value quoted in an error message, cut short: errors are stored and listed, lines are 4 MiB."""
    if isinstance(value, dict | list):
        return "an object" if isinstance(value, dict) else "an array"  # never re-serialised: may be deep
    text = value if isinstance(value, str) else json.dumps(value)
    return "'" + (text if len(text) <= limit else text[:limit] + "…") + "'"


def _estimate(line_bytes: int) -> int:
    """About four bytes of request line per prompt token: only sizes shards and queue limits, so cheap wins."""
    return line_bytes // 4 + 1


def line_error(number: int | None, err: LineInvalid) -> BatchError:
    code, message, param = err.error
    return BatchError(code=code, message=message, param=param, line=number)
