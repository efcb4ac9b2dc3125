"""The endpoint engine: a line's body sent over HTTP to an OpenAI-compatible server that already serves the model
(a model's `endpoint`, nightbatch/models/endpoint.py), instead of to an in-process vLLM.

The shard runner drives it like any engine (gpu_worker/runner.py): same checkpoints, resume, cancel, expiry and
result lines. What differs is what an answer means:
- the server's answer to the line (2xx, or its own 4xx such as a context-length error) is the line's result, the
  body as the server sent it;
- an answer that says "not now" (429, 503, a gateway's 502/504, 408, a 5xx that is not JSON), a timeout or a failed
  connection is never a result: the request waits (Retry-After, else exponential backoff) and goes again, for as
  long as the shard runs (a stop — cancel, expiry, the fallback to GPUs — leaves it unrun);
- a 500 with an OpenAI error body may be the server's (vLLM answers every request in flight so when its engine
  stops) or the line's own: it goes again `endpoint_server_error_retries` times, then it is the line's result;
- 401/403 means nightbatch's credentials are wrong for every line: the engine fails, the attempt with it.

Every request holds a slot of the endpoint's admission (gpu_worker/admission.py: AIMD concurrency, saturation read
from the server's /metrics by gpu_worker/saturation.py) and carries the endpoint's priority (vLLM's `priority`) and
the time left to the batch's deadline (`x-slo-ttft-ms`, the header llm-d's SLO-deadline ordering reads).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

import httpx

from gpu_worker.admission import Admission, AdmissionPolicy, Outcome
from gpu_worker.engines.base import EngineFailedError, EngineReply
from gpu_worker.saturation import watch_load
from nightbatch.errors import openai_error
from nightbatch.models.endpoint import EndpointSpec
from nightbatch.models.spec import MESSAGES_ENDPOINT, ModelSpec
from nightbatch.settings import AdmissionSettings, Settings

log = logging.getLogger("gpu_worker.endpoint")
T = TypeVar("T")

DEADLINE_HEADER = "x-slo-ttft-ms"
PRIORITY_HEADER = "x-vllm-priority"
# Answers that mean "the server cannot take it now", never a line's result.
RETRY_STATUSES = frozenset({408, 429, 502, 503, 504})
REFUSED_STATUSES = frozenset({401, 403})
ERROR_TEXT_CHARS = 2000


class EndpointRefusedError(EngineFailedError):
    """The endpoint refused nightbatch's credentials: no line can run there until the configuration is fixed."""


def resolve_api_key(endpoint: EndpointSpec, secrets_client: Callable[[], Any]) -> str:
    """The endpoint's API key: its environment variable, or its Secrets Manager secret (read once); "" for none."""
    if endpoint.api_key_env:
        key = os.environ.get(endpoint.api_key_env, "")
        if not key:
            raise LookupError(f"endpoint {endpoint.url}: the environment variable {endpoint.api_key_env} is not set")
        return key
    if endpoint.api_key_secret:
        from nightbatch.aws.secrets import secret_string

        return secret_string(secrets_client(), endpoint.api_key_secret)
    return ""


def retry_after_seconds(value: str | None, *, now: float | None = None) -> float | None:
    """A Retry-After header's wait: delta-seconds or an HTTP-date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def endpoint_engine(spec: ModelSpec, settings: Settings, *, secrets_client: Callable[[], Any],
                    deadline: float | None) -> EndpointEngine:
    """The engine for a shard of `spec` on its endpoint: the worker's and the local stack's one way to make it.
    `secrets_client`: a Secrets Manager client, made only when the key is a secret's; `deadline`: the batch's
    expires_at."""
    if spec.endpoint is None:
        raise ValueError(f"model {spec.name!r} has no endpoint")
    return EndpointEngine(spec, settings=settings.admission, api_key=resolve_api_key(spec.endpoint, secrets_client),
                          deadline=deadline)


@dataclass
class _Shared:
    """An endpoint's state in this process: its admission, and the reading of its load while engines use it."""

    admission: Admission
    users: int = 0
    watch: asyncio.Task[None] | None = None
    client: httpx.AsyncClient | None = None


_endpoints: dict[str, _Shared] = {}


class EndpointEngine:
    """A model served elsewhere: `handle` may be called concurrently without limit (the admission bounds what
    reaches the server)."""

    # The runner adds no priority of its own (gpu_worker/runner.py): the endpoint's goes on every request.
    priorities = False
    # Where its attempts ran, for their accounting (batches/accounting.py: AttemptRecord): no GPU of nightbatch's.
    backend = "endpoint"

    def __init__(self, spec: ModelSpec, *, settings: AdmissionSettings | None = None, api_key: str = "",
                 deadline: float | None = None) -> None:
        if spec.endpoint is None:
            raise ValueError(f"model {spec.name!r} has no endpoint")
        self.spec = spec
        self.endpoint: EndpointSpec = spec.endpoint
        self.model_name = spec.name
        self.settings = settings or AdmissionSettings()
        self.policy = AdmissionPolicy.from_settings(self.settings, ceiling=self.endpoint.max_concurrency)
        self.deadline = deadline  # the batch's expires_at (epoch seconds), for the deadline header
        self._api_key = api_key
        self._client: httpx.AsyncClient | None = None
        self._shared: _Shared | None = None
        self._stopping: asyncio.Event | None = None
        # Requests the runner keeps in flight (gpu_worker/scheduling.py reads it): enough to reach the ceiling.
        self.max_num_seqs: int = self.policy.ceiling
        self.retries = 0  # requests sent again by this engine (for logs and tests)

    @property
    def admission(self) -> Admission:
        return self._shared_state().admission

    def _shared_state(self) -> _Shared:
        shared = _endpoints.get(self.endpoint.url)
        if shared is None:
            shared = _endpoints[self.endpoint.url] = _Shared(Admission(self.policy))
        return shared

    async def start(self) -> None:
        if self._client is not None:
            return
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(self.settings.timeout_seconds, connect=min(30.0, self.settings.timeout_seconds)),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=self.policy.ceiling),
        )
        self._stopping = asyncio.Event()
        shared = self._shared = self._shared_state()
        if shared.users == 0:
            shared.admission.unbind()  # its last users may have run on another event loop
            metrics = self.endpoint.served_metrics_url
            if metrics and self.settings.metrics_seconds > 0:
                shared.client = httpx.AsyncClient(timeout=httpx.Timeout(10.0), headers=self._auth_headers())
                shared.watch = asyncio.create_task(watch_load(shared.client, metrics, shared.admission,
                                                              self.settings))
        shared.users += 1

    def stop_sending(self) -> None:
        """The shard is stopping (cancel, expiry, SIGTERM, a move to the GPUs): requests not sent yet — waiting for
        a slot or to retry — end at once as aborted (the runner leaves their lines unrun); those in flight run on
        for the runner's drain."""
        if self._stopping is not None:
            self._stopping.set()

    async def stop(self) -> None:
        client, self._client = self._client, None
        shared, self._shared = self._shared, None
        if client is None:
            return
        await client.aclose()
        if shared is None:
            return
        shared.users -= 1
        if shared.users == 0:
            watch, shared.watch = shared.watch, None
            if watch is not None:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
            metrics_client, shared.client = shared.client, None
            if metrics_client is not None:
                await metrics_client.aclose()
            log.info("endpoint %s: concurrency %.1f (lowest %.1f, highest %.1f), %d decreases, %d overload answers, "
                     "%d saturated readings", self.endpoint.url, shared.admission.limit, shared.admission.stats.lowest,
                     shared.admission.stats.highest, shared.admission.stats.decreases,
                     shared.admission.stats.overloads, shared.admission.stats.saturated_reads)

    async def handle(self, url: str, body: dict[str, Any], request_id: str) -> EngineReply:
        client, shared = self._client, self._shared
        if client is None or shared is None:
            raise EngineFailedError(f"endpoint engine for {self.model_name} is not started")
        admission = shared.admission
        target = self.endpoint.request_url(url)
        content = json.dumps(self._outgoing(url, body), allow_nan=False).encode()
        backoff = self.settings.retry_seconds
        server_errors = 0
        while True:
            sent_at = await self._acquire(admission)
            outcome, retry_after, why = Outcome.NEUTRAL, None, ""
            try:
                response = await client.post(target, content=content, headers=self._headers(request_id))
            except httpx.TimeoutException as exc:
                outcome, why = Outcome.OVERLOAD, f"timeout ({type(exc).__name__})"
            except httpx.TransportError as exc:
                outcome, why = Outcome.OVERLOAD, f"{type(exc).__name__}: {exc}"
            else:
                status = response.status_code
                if status in REFUSED_STATUSES:
                    raise EndpointRefusedError(f"endpoint {self.endpoint.url} answered {status}: check the model's "
                                               f"endpoint api_key_env / api_key_secret ({_text(response)[:200]})")
                reply = _reply(response)
                # A server error with an OpenAI body is the server's as often as the line's (vLLM answers every
                # request in flight with a 500 when its engine stops): tried again a few times, then the result.
                server_error = status >= 500 and reply is not None and status not in RETRY_STATUSES
                server_errors += server_error
                if status in RETRY_STATUSES or (status >= 500 and reply is None) or (
                        server_error and server_errors <= self.settings.server_error_retries):
                    outcome, why = Outcome.OVERLOAD, f"{status}"
                    retry_after = retry_after_seconds(response.headers.get("retry-after"))
                    if retry_after is not None:
                        retry_after = min(retry_after, self.settings.retry_after_max_seconds)
                else:
                    outcome = Outcome.SUCCESS
                    return self._result(status, reply, response, body)
            finally:
                admission.release(sent_at, outcome, retry_after=retry_after)
            self.retries += 1
            wait = retry_after if retry_after is not None else backoff * random.uniform(0.5, 1.0)
            backoff = min(self.settings.retry_max_seconds, backoff * 2)
            log.debug("request %s to %s: %s; again in %.1f s", request_id, target, why, wait)
            await self._unless_stopping(asyncio.sleep(wait))

    async def _acquire(self, admission: Admission) -> float:
        """A slot of the endpoint's admission, unless the shard stops sending first."""
        if self._stopping is not None and self._stopping.is_set():
            raise asyncio.CancelledError
        sent_at = admission.try_acquire()
        return sent_at if sent_at is not None else await self._unless_stopping(admission.acquire())

    async def _unless_stopping(self, awaitable: Coroutine[Any, Any, T]) -> T:
        """`awaitable`'s result; aborted (CancelledError) if the shard stops sending first."""
        task = asyncio.ensure_future(awaitable)
        if self._stopping is None:
            return await task
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not task.done():
                task.cancel()
        if not task.done() or task.cancelled():
            raise asyncio.CancelledError
        return task.result()

    def _outgoing(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        """The body as the server needs it: the model by the server's name, the endpoint's priority."""
        out = dict(body)
        if self.endpoint.model and out.get("model") == self.spec.name:
            out["model"] = self.endpoint.model
        if self.endpoint.priority is not None and url != MESSAGES_ENDPOINT:  # Anthropic's Messages has no field
            out["priority"] = self.endpoint.priority  # a line never outranks the online traffic
        return out

    def _auth_headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self._api_key}"} if self._api_key else {}

    def _headers(self, request_id: str) -> dict[str, str]:
        headers = {**self.endpoint.headers, "content-type": "application/json", "x-request-id": request_id,
                   **self._auth_headers()}
        if self.endpoint.priority is not None:
            headers[PRIORITY_HEADER] = str(self.endpoint.priority)
        if self.deadline is not None:
            headers[DEADLINE_HEADER] = str(max(0, int((self.deadline - time.time()) * 1000)))
        return headers

    def _result(self, status: int, reply: dict[str, Any] | None, response: httpx.Response,
                body: dict[str, Any]) -> EngineReply:
        if reply is None:
            if 200 <= status < 300:
                return EngineReply(502, _error(f"The endpoint answered {status} with a body that is not a JSON "
                                               f"object: {_text(response)[:ERROR_TEXT_CHARS]}", status=502))
            return EngineReply(status, _error(f"The endpoint answered {status}: {_text(response)[:ERROR_TEXT_CHARS]}",
                                              status=status))
        if 200 <= status < 300 and self.endpoint.model and reply.get("model") == self.endpoint.model:
            # The name the line asked for, as the in-process engine answers (it serves the model under that name).
            reply["model"] = body.get("model", self.spec.name)
        return EngineReply(status, reply)


def _reply(response: httpx.Response) -> dict[str, Any] | None:
    try:
        parsed = json.loads(response.content)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _text(response: httpx.Response) -> str:
    return " ".join(response.content.decode("utf-8", "replace").split())


def _error(message: str, *, status: int) -> dict[str, Any]:
    return openai_error(message, type_="server_error" if status >= 500 else "invalid_request_error", code=status)
