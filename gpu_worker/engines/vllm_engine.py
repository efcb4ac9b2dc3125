"""The vLLM engine: OpenAI request bodies answered by vLLM's own serving layer, as `run_batch` does.

The running engine and `handle()`; the arguments it is started with are `gpu_worker.engines.vllm_args`'s."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import sys
import time
import warnings
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from http import HTTPStatus
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pydantic
from starlette.datastructures import State
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from gpu_worker.engines.base import EngineFailedError, EngineReply
from gpu_worker.engines.vllm_args import cli_namespace, prepare_platform, split_args
from gpu_worker.model_prep import resolve_model_dir
from nightbatch.errors import openai_error
from nightbatch.models.spec import ModelSpec

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
EMBEDDINGS_URL = "/v1/embeddings"
RESPONSES_URL = "/v1/responses"
SCORE_URL = "/v1/score"
RERANK_URL = "/v1/rerank"
MESSAGES_URL = "/v1/messages"  # Anthropic's Messages API (the Anthropic wire's batches: nightbatch/messages/)


@dataclasses.dataclass(frozen=True)
class _Route:
    parse: Callable[[dict[str, Any]], Any]
    serve: Callable[[Any], Awaitable[Any]] | None
    missing: str  # what vLLM's router says when the model has no handler for this endpoint
    id_prefix: str = ""  # vLLM uses a Responses request id as the response id as-is: give it OpenAI's "resp_"
    by_alias: bool = False  # the Responses router renders its models with model_dump(mode="json", by_alias=True)
    exclude_none: bool = False  # the Messages router renders its Message with model_dump(exclude_none=True)


@dataclasses.dataclass(frozen=True)
class _MessagesCall:
    """A Messages request, its Message's id (vLLM would reuse its chat request's, `chatcmpl-…`) and the scheduling
    priority the runner gave it (gpu_worker/runner.py)."""

    request: Any
    message_id: str
    priority: int = 0


class VllmEngine:
    """One model served by an in-process vLLM AsyncLLM; `handle` may be called concurrently without limit."""

    def __init__(
        self, spec: ModelSpec, *, model_dir: Path | str | None = None, cache_dir: Path | None = None,
        load_format: str | None = None, lora_dirs: dict[str, str] | None = None, media_domains: str = "",
    ) -> None:
        self.spec = spec
        self._media_domains = media_domains  # NIGHTBATCH_MEDIA_ALLOWED_DOMAINS: the hosts vLLM may fetch from
        # The model's LoRA adapters as local directories (gpu_worker/weight_cache.py resolve_adapters);
        # None: resolved on start.
        self._lora_dirs = lora_dirs
        self.model_name = spec.name
        # A local directory, or an s3:// URI with load_format="runai_streamer" (gpu_worker/weight_cache.py).
        self._model_dir = model_dir
        self._load_format = load_format
        self._cache_dir = cache_dir
        self._stack: AsyncExitStack | None = None
        self._state: State | None = None
        self._routes: dict[str, _Route] = {}
        self.start_seconds: float | None = None
        # The engine's sequence slots, read by the runner to keep enough requests in flight (scheduling.py).
        self.max_num_seqs: int | None = None
        self.max_logprobs: int = -1  # the model's limit on log probabilities per token (-1: none)

    async def start(self) -> None:
        if self._stack is not None:
            return
        started = time.monotonic()
        on_cpu = prepare_platform()
        model_dir = self._model_dir
        if model_dir is None:
            model_dir = await asyncio.to_thread(resolve_model_dir, self.spec, self._cache_dir)
        lora_dirs = self._lora_dirs
        if lora_dirs is None and self.spec.lora_modules:
            from gpu_worker.weight_cache import resolve_adapters

            lora_dirs = await asyncio.to_thread(resolve_adapters, self.spec, cache_dir=self._cache_dir)

        from vllm.entrypoints.launchers.api_server.app_state import init_app_state
        from vllm.entrypoints.launchers.api_server.entry import build_async_engine_client_from_engine_args
        from vllm.usage.usage_lib import UsageContext

        engine_args, frontend = split_args(self.spec, model_dir, on_cpu=on_cpu, media_domains=self._media_domains,
                                           load_format=self._load_format, lora_dirs=lora_dirs)
        stack = AsyncExitStack()
        try:
            client = await stack.enter_async_context(
                build_async_engine_client_from_engine_args(
                    engine_args, usage_context=UsageContext.OPENAI_BATCH_RUNNER
                )
            )
            # init_app_state is what both the OpenAI server and run_batch use to build the serving objects.
            args = cli_namespace(engine_args, frontend)
            state = State()
            await init_app_state(client, state, args, await client.get_supported_tasks())
            if self.spec.task == "score" and getattr(state, "serving_scores", None) is None:
                raise ValueError(f"model {self.model_name!r} has task 'score', but vLLM serves no scoring API "
                                 "for it: a cross-encoder needs a classification head with one label (num_labels=1)")
        except BaseException:
            await stack.aclose()
            raise
        self._stack, self._state = stack, state
        self._routes = _routes(state)
        self.max_num_seqs = int(client.vllm_config.scheduler_config.max_num_seqs)
        self.max_logprobs = int(client.vllm_config.model_config.max_logprobs)
        # vLLM's first imports run under this frame and a module keeps one of their tracebacks, which
        # pins this frame; without the del its locals would keep the AsyncLLM alive after stop().
        del client, state, stack, args
        self.start_seconds = time.monotonic() - started
        print(
            f"[nightbatch.engine] {self.model_name} ready in {self.start_seconds:.1f} s ({model_dir})",
            file=sys.stderr,
            flush=True,
        )

    async def stop(self) -> None:
        stack, self._stack, self._state, self._routes = self._stack, None, None, {}
        if stack is None:
            return
        # vLLM's shutdown leaves its zmq context to the garbage collector, which warns about it.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            await stack.aclose()
            # Let the output tasks vLLM just cancelled finish, then collect AsyncLLM's reference cycles now
            # rather than at interpreter exit, where its __del__ runs shutdown() again on torn-down globals.
            for _ in range(3):
                await asyncio.sleep(0)
            gc.collect()

    async def handle(self, url: str, body: dict[str, Any], request_id: str) -> EngineReply:
        if self._state is None:
            raise EngineFailedError(f"engine for {self.model_name} is not started")
        self._raise_if_dead()
        from vllm.entrypoints.serve import create_error_response
        from vllm.v1.engine.exceptions import EngineDeadError

        route = self._routes.get(url)
        if route is None:
            return _error_reply(
                create_error_response(
                    f"Unsupported URL {url}", err_type="NotFoundError", status_code=HTTPStatus.NOT_FOUND
                )
            )
        if route.serve is None:
            return _error_reply(create_error_response(NotImplementedError(route.missing)))
        if body.get("stream"):
            # A batch has nowhere to stream to; run_batch refuses these the same way.
            return _error_reply(
                create_error_response("Request must not be sent in stream mode", param="stream")
            )
        over = logprobs_over_limit(url, body, self.max_logprobs)
        if over is not None:
            return _error_reply(create_error_response(over[0], param=over[1]))
        try:
            # Engine request ids must be unique among in-flight requests, so ours replaces any the user sent;
            # vLLM turns it into the response id (chatcmpl-<id>, cmpl-<id>, embd-<id>).
            request = route.parse({**body, "request_id": route.id_prefix + request_id})
        except pydantic.ValidationError as exc:
            return await self._validation_reply(exc)
        except Exception as exc:
            return _error_reply(create_error_response(exc))
        try:
            result = await route.serve(request)
        except EngineDeadError as exc:
            raise EngineFailedError(f"the vLLM engine for {self.model_name} has died") from exc
        except Exception as exc:  # the server's exception handlers turn these into error envelopes
            result = create_error_response(exc)
        reply = await _reply(result, by_alias=route.by_alias, exclude_none=route.exclude_none)
        if reply.status_code >= 500:
            # The serving layer answers a dead engine with a 500 like any other failure; tell them apart.
            self._raise_if_dead()
        return reply

    def _raise_if_dead(self) -> None:
        client = getattr(self._state, "engine_client", None)
        if client is not None and client.errored:
            raise EngineFailedError(f"the vLLM engine for {self.model_name} has died")

    async def count_prompt_tokens(self, url: str, body: dict[str, Any]) -> int | None:
        """Tokens in the rendered prompt (chat template applied), or None when it cannot be counted."""
        from vllm.entrypoints.serve.tokenize.protocol import TokenizeChatRequest, TokenizeCompletionRequest

        if self._state is None:
            return None
        try:
            request: Any
            if url == CHAT_URL:
                request = TokenizeChatRequest.model_validate(
                    {k: body[k] for k in ("model", "messages", "tools") if k in body}
                )
            else:
                prompt = body.get("prompt", body.get("input"))
                if not isinstance(prompt, str):
                    return None
                request = TokenizeCompletionRequest(model=body.get("model"), prompt=prompt)
            result = await self._state.serving_tokenization.create_tokenize(request, None)
        except Exception:
            return None
        count = getattr(result, "count", None)
        return count if isinstance(count, int) else None

    async def _validation_reply(self, exc: pydantic.ValidationError) -> EngineReply:
        from fastapi.exceptions import RequestValidationError
        from vllm.entrypoints.serve.exception_handling.handlers.validation import validation_exception_handler

        # FastAPI reports body errors with a leading "body" in loc; vLLM's handler then renders the message
        # and `param` exactly as the server does. It only reads app.state.args from the request.
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        request = Request({"type": "http", "app": SimpleNamespace(state=self._state), "headers": []})
        response = await validation_exception_handler(request, RequestValidationError(errors))
        return _response_reply(response)


def logprobs_over_limit(url: str, body: dict[str, Any], limit: int) -> tuple[str, str] | None:
    """(message, param) when a request asks for more log probabilities per token than the model returns; vLLM
    refuses it too, but in terms of its own sampling parameters rather than the field the line sent."""
    if url == COMPLETIONS_URL:
        param, asked = "logprobs", body.get("logprobs")
    elif url == CHAT_URL:
        param, asked = "top_logprobs", body.get("top_logprobs") if body.get("logprobs") else None
    elif url == RESPONSES_URL:
        param, asked = "top_logprobs", body.get("top_logprobs")
    else:
        return None
    if limit < 0 or not isinstance(asked, int) or isinstance(asked, bool) or asked <= limit:
        return None
    return (f"'{param}' is {asked}, over this model's limit of {limit} log probabilities per token (the model's "
            "`max_logprobs` engine argument).", param)


def _routes(state: State) -> dict[str, _Route]:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
    from vllm.entrypoints.pooling.embed.protocol import EmbeddingRequest
    from vllm.entrypoints.pooling.scoring.protocol import RerankRequest, ScoreRequest

    chat = getattr(state, "openai_serving_chat", None)
    completion = getattr(state, "openai_serving_completion", None)
    embedding = getattr(state, "serving_embedding", None)
    responses = getattr(state, "openai_serving_responses", None)
    embedding_adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(EmbeddingRequest)
    # One ServingScores answers both (a cross-encoder, or cosine similarity for an embedding model).
    scores = getattr(state, "serving_scores", None)
    score_adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ScoreRequest)
    return {
        CHAT_URL: _Route(
            ChatCompletionRequest.model_validate,
            chat.create_chat_completion if chat is not None else None,
            "The model does not support Chat Completions API",
        ),
        COMPLETIONS_URL: _Route(
            CompletionRequest.model_validate,
            completion.create_completion if completion is not None else None,
            "The model does not support Completions API",
        ),
        EMBEDDINGS_URL: _Route(
            embedding_adapter.validate_python,
            embedding,
            "The model does not support Embeddings API",
        ),
        RESPONSES_URL: _Route(
            ResponsesRequest.model_validate,
            responses.create_responses if responses is not None else None,
            "The model does not support Responses API",
            id_prefix="resp_",
            by_alias=True,
        ),
        SCORE_URL: _Route(score_adapter.validate_python, scores, "The model does not support Score API"),
        RERANK_URL: _Route(RerankRequest.model_validate, scores, "The model does not support Rerank (Score) API"),
        MESSAGES_URL: _messages_route(getattr(state, "anthropic_serving_messages", None)),
    }


def _messages_route(serving: Any) -> _Route:
    """Anthropic Messages through vLLM's Anthropic serving layer (it converts to a chat request and back)."""
    from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest, AnthropicMessagesResponse

    def parse(body: dict[str, Any]) -> _MessagesCall:
        fields = {k: v for k, v in body.items() if k not in ("request_id", "priority")}
        return _MessagesCall(AnthropicMessagesRequest.model_validate(fields),
                             "msg_" + str(body["request_id"]).removeprefix("req_"), int(body.get("priority") or 0))

    async def serve(call: _MessagesCall) -> Any:
        # Anthropic's request has no `priority` (the OpenAI ones do) and the chat request vLLM converts it to gets
        # none of it: the priority goes as vLLM's priority header, which the chat serving reads first.
        result = await serving.create_messages(call.request, _priority_request(call.priority) if call.priority
                                               else None)
        if isinstance(result, AnthropicMessagesResponse):
            result.id = call.message_id
        return result

    return _Route(parse, serve if serving is not None else None, "The model does not support Messages API",
                  exclude_none=True)


def _priority_request(priority: int) -> Request:
    """A stand-in for the HTTP request vLLM's serving layer reads headers from, carrying only the priority header."""
    from vllm.entrypoints.generate.base.serving import PRIORITY_HEADER

    return Request({"type": "http", "headers": [(PRIORITY_HEADER.lower().encode(), str(priority).encode())]})


async def _reply(result: Any, *, by_alias: bool = False, exclude_none: bool = False) -> EngineReply:
    from vllm.entrypoints.serve import create_error_response
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse

    if isinstance(result, ErrorResponse):
        return _error_reply(result)
    if isinstance(result, StreamingResponse):
        # Embeddings with a binary encoding_format come back as a raw byte stream, which has no place in a
        # JSONL result line.
        return _error_reply(
            create_error_response(
                "Binary encoding formats cannot be returned in a batch; use 'float' or 'base64'",
                param="encoding_format",
            )
        )
    if isinstance(result, Response):
        return _response_reply(result)
    if isinstance(result, pydantic.BaseModel):
        # The routers answer with JSONResponse(content=model_dump()); rendering through it keeps the
        # server's JSON exactly (for example non-finite logprobs).
        dumped = (result.model_dump(mode="json", by_alias=True) if by_alias
                  else result.model_dump(exclude_none=exclude_none))
        return _response_reply(JSONResponse(content=dumped))
    aclose = getattr(result, "aclose", None)
    if aclose is not None:  # a streaming generator: close it so vLLM aborts the request
        await aclose()
    return _error_reply(create_error_response("Request must not be sent in stream mode", param="stream"))


def _error_reply(error: Any) -> EngineReply:
    return _response_reply(JSONResponse(content=error.model_dump(), status_code=error.error.code))


def _response_reply(response: Response) -> EngineReply:
    body = json.loads(bytes(response.body))
    if not isinstance(body, dict):
        return EngineReply(status_code=500, body=openai_error("engine returned a non-object body",
                                                              type_="InternalServerError", code=500))
    return EngineReply(status_code=response.status_code, body=body)
