"""Which server and key the CLI commands and the doctor use, and one-line explanations of what can go wrong."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from urllib.parse import urlsplit

import openai
from pydantic import ValidationError

from nightbatch.local.stack import state_file
from nightbatch.settings import Settings, variable_of


class CommandError(Exception):
    """A problem the user can fix: printed as one line, no traceback."""

    exit_code = 1


class Interrupted(CommandError):
    exit_code = 130


@dataclass(frozen=True)
class Target:
    base_url: str  # ends in /v1, like the base_url the OpenAI SDK expects
    api_key: str


def resolve_target(base_url: str | None, api_key: str | None) -> Target:
    """Flags first, then NIGHTBATCH_BASE_URL / NIGHTBATCH_API_KEY, then the `nightbatch local` here."""
    try:
        settings = Settings()
    except ValidationError as e:
        first = e.errors()[0]
        raise CommandError(f"{variable_of(first['loc'])} in the environment is invalid: {first['msg']}") from None
    url = base_url or settings.cli.base_url or running_local_url()
    if not url:
        raise CommandError("no server given: pass --base-url or set NIGHTBATCH_BASE_URL "
                           "(or start one here with `nightbatch local`)")
    key = api_key or settings.api.api_key
    if not key:
        raise CommandError("no API key given: pass --api-key or set NIGHTBATCH_API_KEY "
                           "(`nightbatch local` prints its key when it starts)")
    return Target(base_url=api_root(url), api_key=key)


def running_local_url() -> str | None:
    """The URL recorded by a `nightbatch local` still running on this machine (its key is not recorded)."""
    try:
        state = json.loads(state_file().read_text())
    except (OSError, ValueError):
        return None
    pid = state.get("pid")
    if isinstance(pid, int) and not _alive(pid):
        return None  # left behind by a stack that did not stop cleanly
    url = state.get("base_url")
    return url if isinstance(url, str) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def api_root(url: str) -> str:
    """Accepts `http://host:8000` as well as `http://host:8000/v1` (or an API Gateway stage URL)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise CommandError(f"not an http(s) URL: {url!r}")
    path = parts.path.rstrip("/")
    if not path.endswith("/v1"):
        path += "/v1"
    return f"{parts.scheme}://{parts.netloc}{path}"


def connect(target: Target) -> openai.OpenAI:
    # The stock SDK, exactly as a user's own code would build it: only host and key differ from OpenAI.
    return openai.OpenAI(base_url=target.base_url, api_key=target.api_key)


def explain(error: Exception) -> str:
    """One line for an exception the user can act on."""
    if isinstance(error, openai.APIStatusError):
        body = error.body
        message = body.get("message") if isinstance(body, dict) else None
        text = f"{message or error.message} (HTTP {error.status_code})"
        if isinstance(error, openai.AuthenticationError):
            text += " Check --api-key / NIGHTBATCH_API_KEY."
        return text
    if isinstance(error, openai.APIConnectionError):
        url = urlsplit(str(error.request.url))
        where = f"{url.scheme}://{url.netloc}"
        if isinstance(error, openai.APITimeoutError):
            return f"{where} did not answer in time"
        cause = error.__cause__
        reason = f": {cause}" if cause and len(str(cause)) < 120 else ""
        return f"cannot reach {where}{reason}. Is the server running?"
    if isinstance(error, OSError):
        name = f"{error.filename}: " if error.filename else ""
        return f"{name}{error.strerror or error}"
    return str(error)
