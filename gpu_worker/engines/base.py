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


class Engine(Protocol):
    """A started engine serves many concurrent `handle` calls; it never raises for a bad request."""

    model_name: str  # served model name

    async def start(self) -> None: ...

    # url is one of /v1/chat/completions, /v1/completions, /v1/embeddings
    async def handle(self, url: str, body: dict[str, Any], request_id: str) -> EngineReply: ...

    async def stop(self) -> None: ...
