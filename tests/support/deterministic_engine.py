"""TEST DOUBLE: a deterministic fake engine for unit tests of the shard runner's own logic, nothing else.

It implements `gpu_worker.engines.base.Engine` without any model: replies are derived from a hash of the
request, so the same request always gets the same body. It exists so runner tests (concurrency,
checkpointing, resume, cancel, crash safety) run in milliseconds; everything a user can see comes from the
real vLLM engine (docs/ARCHITECTURE.md, decision 8).

Behaviour:
- /v1/chat/completions -> a `chat.completion`; /v1/completions -> a `text_completion`;
  /v1/embeddings -> a list of fixed-dimension vectors; /v1/messages -> an Anthropic `message`;
  any other url -> 404 envelope.
- A body with `"max_tokens": -1`, or prompt/message text containing "FAIL" -> 400 with an error envelope,
  as an engine rejecting a request does.
- Prompt/message text containing "RAISE" -> `handle` raises RuntimeError (an unexpected engine exception).
- An optional per-request delay (ctor `delay=`, else env NIGHTBATCH_TEST_ENGINE_DELAY in seconds) gives
  kill and cancel tests a time window.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from typing import Any, ClassVar

from gpu_worker.engines.base import EngineReply
from nightbatch.models.spec import ModelSpec

DELAY_ENV = "NIGHTBATCH_TEST_ENGINE_DELAY"  # read here, not in Settings: a test-only knob
EMBEDDING_DIM = 8
CREATED = 1_700_000_000


class DeterministicEngine:
    """Test double for the Engine protocol; records what it was asked so tests can assert on it."""

    starts: ClassVar[int] = 0  # engine starts in this process, across instances (main's preflight test)

    def __init__(self, spec: ModelSpec, *, delay: float | None = None) -> None:
        self.spec = spec
        self.model_name = spec.name
        self.delay = float(os.environ.get(DELAY_ENV, "0") or 0) if delay is None else delay
        self.received: list[tuple[str, dict[str, Any]]] = []
        self.in_flight = 0
        self.peak_in_flight = 0
        self.started = False

    async def start(self) -> None:
        type(self).starts += 1
        self.started = True

    async def stop(self) -> None:
        self.started = False

    async def handle(self, url: str, body: dict[str, Any], request_id: str) -> EngineReply:
        self.received.append((url, body))
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            return self._answer(url, body, request_id)
        finally:
            self.in_flight -= 1

    def _answer(self, url: str, body: dict[str, Any], request_id: str) -> EngineReply:
        text = _prompt_text(body)
        if "RAISE" in text:
            raise RuntimeError("deterministic engine asked to raise")
        if body.get("max_tokens") == -1 or "FAIL" in text:
            return _error(400, "BadRequestError", "The test engine rejected this request.", "max_tokens")
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        prompt_tokens = max(1, len(text.split()))
        if url == "/v1/chat/completions":
            return EngineReply(200, self._chat(body, digest, request_id, prompt_tokens))
        if url == "/v1/completions":
            return EngineReply(200, self._completion(body, digest, request_id, prompt_tokens))
        if url == "/v1/embeddings":
            return EngineReply(200, self._embeddings(body, digest, prompt_tokens))
        if url == "/v1/messages":
            return EngineReply(200, self._message(body, digest, request_id, prompt_tokens))
        return _error(404, "NotFoundError", f"Unsupported URL {url}", None)

    def _reply_text(self, body: dict[str, Any], digest: str) -> tuple[str, int, str]:
        cap = body.get("max_tokens") or body.get("max_completion_tokens") or 16
        words = [f"w{digest[i:i + 4]}" for i in range(0, 40, 4)][: max(1, min(int(cap), 10))]
        finish = "length" if int(cap) < 10 else "stop"
        return " ".join(words), len(words), finish

    def _served_name(self, body: dict[str, Any]) -> str:
        """As vLLM answers: a request naming one of the model's LoRA adapters is answered under its name."""
        name = body.get("model")
        return name if isinstance(name, str) and name in self.spec.lora_modules else self.model_name

    def _chat(self, body: dict[str, Any], digest: str, request_id: str, prompt_tokens: int) -> dict[str, Any]:
        text, n, finish = self._reply_text(body, digest)
        return {
            "id": f"chatcmpl-{request_id}", "object": "chat.completion", "created": CREATED,
            "model": self._served_name(body),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                         "finish_reason": finish}],
            "usage": _usage(prompt_tokens, n),
        }

    def _message(self, body: dict[str, Any], digest: str, request_id: str, prompt_tokens: int) -> dict[str, Any]:
        """As vLLM's Anthropic serving layer answers /v1/messages."""
        text, n, finish = self._reply_text(body, digest)
        return {
            "id": f"msg_{request_id}", "type": "message", "role": "assistant", "model": self._served_name(body),
            "content": [{"type": "text", "text": text}], "stop_reason": "max_tokens" if finish == "length" else
            "end_turn", "stop_sequence": None, "usage": {"input_tokens": prompt_tokens, "output_tokens": n},
        }

    def _completion(
        self, body: dict[str, Any], digest: str, request_id: str, prompt_tokens: int
    ) -> dict[str, Any]:
        text, n, finish = self._reply_text(body, digest)
        return {
            "id": f"cmpl-{request_id}", "object": "text_completion", "created": CREATED,
            "model": self.model_name,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
            "usage": _usage(prompt_tokens, n),
        }

    def _embeddings(self, body: dict[str, Any], digest: str, prompt_tokens: int) -> dict[str, Any]:
        raw = body.get("input")
        inputs = raw if isinstance(raw, list) and raw and not isinstance(raw[0], int) else [raw]
        data = []
        for i, item in enumerate(inputs):
            h = hashlib.sha256(f"{digest}:{i}:{item}".encode()).digest()
            data.append({"object": "embedding", "index": i,
                         "embedding": [round(b / 255.0 - 0.5, 6) for b in h[:EMBEDDING_DIM]]})
        return {
            "object": "list", "data": data, "model": self.model_name,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        }


def _prompt_text(body: dict[str, Any]) -> str:
    parts: list[str] = []
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
    for key in ("prompt", "input"):
        value = body.get(key)
        if isinstance(value, str):
            parts.append(value)
        elif isinstance(value, list):
            parts.extend(v for v in value if isinstance(v, str))
    return " ".join(parts)


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _error(status: int, type_: str, message: str, param: str | None) -> EngineReply:
    # The shape vLLM's serving layer gives (`code` is the HTTP status there).
    return EngineReply(status, {"error": {"message": message, "type": type_, "param": param, "code": status}})
