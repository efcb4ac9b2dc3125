"""Result lines in OpenAI's batch output format, built from engine replies, and the tokens they report."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpu_worker.engines.base import EngineFailedError, EngineReply
from nightbatch.errors import openai_error
from nightbatch.results import lines as results
from nightbatch.validation.line import LineFailure


@dataclass(frozen=True)
class ResultLine:
    custom_id: str
    data: bytes  # one compact JSON line, "\n"-terminated
    ok: bool
    input_tokens: int
    output_tokens: int
    number: int = -1  # its request's input line number (checkpoints are written in this order); -1: unknown


def is_fatal(exc: BaseException) -> bool:
    """The engine is gone (not an answer to one request): the attempt must fail and the shard be retried,
    rather than write a 500 line for every request left."""
    return isinstance(exc, EngineFailedError)


def exception_reply(exc: BaseException) -> EngineReply:
    """An unexpected exception for one request, as the 500 an OpenAI-compatible server would answer."""
    message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return EngineReply(status_code=500, body=openai_error(message, type_="server_error", code="internal_error"))


def unencodable_reply(exc: BaseException) -> EngineReply:
    return EngineReply(status_code=500, body=openai_error(
        f"The engine's reply to this request cannot be written as JSON ({type(exc).__name__}).",
        type_="server_error", code="internal_error"))


def input_failure_line(batch_id: str, custom_id: str, failure: LineFailure, number: int) -> ResultLine:
    """The error line of a request whose input line can no longer be read as Validate accepted it."""
    return ResultLine(custom_id, results.error_line(batch_id, custom_id, failure.code, failure.line_message(number)),
                      False, 0, 0, number)


def result_line(batch_id: str, custom_id: str, request_id: str, reply: EngineReply, *,
                number: int = -1) -> ResultLine:
    ok = 200 <= reply.status_code < 300
    input_tokens, output_tokens = usage_tokens(reply.body) if ok else (0, 0)
    try:
        data = results.encode(batch_id, custom_id, response=results.Response(reply.status_code, request_id,
                                                                              reply.body))
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError among them: a lone surrogate in the reply
        # An answer no JSON line can carry is this request's error, never a crashed shard.
        return result_line(batch_id, custom_id, request_id, unencodable_reply(exc), number=number)
    if len(data) > results.MAX_RESULT_LINE:
        # Finalize could not read it back: this request's error, rather than a silently unrun line.
        return ResultLine(custom_id, results.oversized_result_line(batch_id, custom_id, len(data)), False, 0, 0,
                          number)
    return ResultLine(custom_id, data, ok, input_tokens, output_tokens, number)


def usage_tokens(body: dict[str, Any]) -> tuple[int, int]:
    """(prompt, completion) tokens from an OpenAI body's `usage`; embeddings have no completion tokens, and a
    Responses object names them input_tokens / output_tokens."""
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return 0, 0
    if "input_tokens" in usage:
        return _int(usage.get("input_tokens")), _int(usage.get("output_tokens"))
    return _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens"))


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0
