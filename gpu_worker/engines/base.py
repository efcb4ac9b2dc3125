"""The engine interface the shard runner drives: one OpenAI request body in, one HTTP status and body out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class EngineReply:
    """What vLLM's OpenAI server would have answered to one request."""

    status_code: int  # 200 on success, else the HTTP status vLLM's serving layer gives
    # Exactly the body vLLM's OpenAI server would return: chat.completion / text_completion / embedding
    # list, or the error envelope {"error": {...}}.
    body: dict[str, Any]


class EngineFailedError(RuntimeError):
    """The engine itself is unusable (not started, or its core process died): no answer to any request.

    The only exception `handle` raises; a shard runner should stop and let the shard be retried rather than
    write error lines for the requests it has left.
    """


class Engine(Protocol):
    """A started engine serves many concurrent `handle` calls; a request it rejects is a non-2xx reply."""

    model_name: str  # served model name

    async def start(self) -> None: ...

    # url is one of /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses, /v1/score, /v1/rerank.
    # request_id must be unique among the requests in flight; vLLM puts it in the body's id (chatcmpl-<request_id>,
    # cmpl-…, embd-…, resp_…, score-…).
    async def handle(self, url: str, body: dict[str, Any], request_id: str) -> EngineReply: ...

    async def stop(self) -> None: ...
