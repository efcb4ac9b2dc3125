"""The Messages route carries the runner's priority to vLLM (gpu_worker.engines.vllm_engine): Anthropic's request has
no `priority` field and vLLM's conversion to a chat request drops what it does not know, so without the route's
priority header a Messages line would run at priority 0, ahead of every other shard's backlog on a shared engine.

vLLM's own conversion and its own priority reader run here; only the serving object around them is the test's
(no engine is started)."""

from __future__ import annotations

import asyncio
from typing import Any

from gpu_worker.engines.vllm_engine import _messages_route

BODY = {"model": "SmolLM2-135M-Instruct", "max_tokens": 8, "messages": [{"role": "user", "content": "Say 1"}],
        "request_id": "req_0123"}


class PrioritiesSeen:
    """Answers create_messages with the priority vLLM's chat serving would give the converted request."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    async def create_messages(self, request: Any, raw_request: Any = None) -> None:
        from vllm.entrypoints.anthropic.serving import AnthropicServingMessages
        from vllm.entrypoints.generate.base.serving import GenerateBaseServing

        chat = AnthropicServingMessages.to_chat_completion_request(request)
        self.seen.append(GenerateBaseServing._get_priority(chat, raw_request))


def test_a_messages_line_runs_at_the_priority_the_runner_gave_it() -> None:
    serving = PrioritiesSeen()
    route = _messages_route(serving)
    assert route.serve is not None
    serve = route.serve

    async def run(body: dict[str, Any]) -> None:
        await serve(route.parse(body))

    for body in ({**BODY, "priority": 7}, {**BODY, "priority": 0}, BODY):
        asyncio.run(run(body))
    assert serving.seen == [7, 0, 0]
