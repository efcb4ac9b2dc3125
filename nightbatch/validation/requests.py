"""Checks of one request body that stand alone (tools, Responses state, template kwargs) and the token estimate:
below Validator, the per-endpoint checkers (validation/scoring.py) and the media references' walker
(validation/media.py)."""

from __future__ import annotations

import json
from typing import Any

from nightbatch.models.spec import ModelSpec
from nightbatch.validation.invalid import LineInvalid

MAX_ECHO = 64


def echo(value: Any, limit: int = MAX_ECHO) -> str:
    """A user value quoted in an error message, cut short: errors are stored and listed, lines are 4 MiB."""
    if isinstance(value, dict | list):
        return "an object" if isinstance(value, dict) else "an array"  # never re-serialised: may be deep
    text = value if isinstance(value, str) else json.dumps(value)
    return "'" + (text if len(text) <= limit else text[:limit] + "…") + "'"


def check_tools(spec: ModelSpec, body: dict[str, Any]) -> None:
    """A line with `tools` needs a model configured for tool calls; say which setting, not vLLM's flag."""
    tools = body.get("tools")
    choice = body.get("tool_choice", "auto" if tools else "none")
    if not tools or choice == "none":
        return
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") or choice.get("name")
        asked = f"tool_choice naming function {echo(name)}" if isinstance(name, str) else "a named tool_choice"
    else:
        asked = f"tool_choice {choice!r}"
    where = "its entry in NIGHTBATCH_MODELS_JSON or cdk.json `models`"
    if not spec.tool_call_parser:
        raise LineInvalid("tools_unsupported", f"The model '{spec.name}' is not configured for tool calls, so "
                          f"this request's `tools` with {asked} cannot be answered: set the model's "
                          f"`tool_call_parser` setting ({where}; e.g. \"hermes\" for Qwen2.5) or remove "
                          "`tools`.", "body.tools")
    if choice == "auto" and not spec.enable_auto_tool_choice:
        raise LineInvalid("tools_unsupported", f"The model '{spec.name}' does not choose tools on its own "
                          "(tool_choice 'auto', the default when `tools` are given): set the model's "
                          f"`enable_auto_tool_choice` setting ({where}), or send tool_choice 'required' or "
                          "a named function.", "body.tool_choice")


# Responses API parameters that read or write state kept between requests: a batch line stands alone.
_STATEFUL = {
    "previous_response_id": "continues a stored response",
    "conversation": "continues a stored conversation",
    "prompt": "names a stored prompt template",
}


def check_responses(spec: ModelSpec, body: dict[str, Any], default_max_tokens: int) -> int:
    """A /v1/responses line: `input` required, no stored state, function tools only. Returns its output cap."""
    inputs = body.get("input")
    if not isinstance(inputs, (str, list)) or not inputs:
        raise LineInvalid("invalid_request", "Input parameter is required.", "body.input")
    for name, what in _STATEFUL.items():
        if body.get(name) is not None:
            raise LineInvalid("unsupported_parameter", f"'{name}' {what}, which the Batch API does not keep: "
                              "each line must carry its whole conversation in `input` (and `instructions`).",
                              f"body.{name}")
    if body.get("background"):
        raise LineInvalid("unsupported_parameter", "'background' is not supported in the Batch API: every "
                          "line already runs in the background.", "body.background")
    if isinstance(inputs, list) and any(isinstance(i, dict) and i.get("type") == "item_reference" for i in inputs):
        raise LineInvalid("unsupported_parameter", "Input items of type 'item_reference' point at stored items, "
                          "which the Batch API does not keep: send the items themselves.", "body.input")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise LineInvalid("invalid_request", "'tools' must be a list.", "body.tools")
    for tool in tools or []:
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise LineInvalid("unsupported_parameter", f"Tool type {echo(kind)} is not supported in the Batch API: "
                              "only 'function' tools, which the model calls and you run.", "body.tools")
    check_tools(spec, body)
    check_template_kwargs(body)
    cap = body.get("max_output_tokens")
    if cap is None:
        return default_max_tokens
    if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
        raise LineInvalid("invalid_request", "'max_output_tokens' must be a positive integer.",
                          "body.max_output_tokens")
    return cap


# Anthropic's tool_choice types as the OpenAI choices check_tools reads ("tool" names one: a dict).
_ANTHROPIC_CHOICE = {"auto": "auto", "any": "required", "none": "none"}


def check_messages(spec: ModelSpec, body: dict[str, Any]) -> int:
    """A /v1/messages line (Anthropic's Messages API, the Anthropic wire's batches): `max_tokens` and
    `messages` required as Anthropic requires them, text or content-block turns, tools only on a model
    configured for them (its image sources, at any depth: validation/media.py). Returns its output cap."""
    cap = body.get("max_tokens")
    if cap is None:
        raise LineInvalid("missing_required_parameter", "Field required", "body.max_tokens")
    if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
        raise LineInvalid("invalid_request", "must be a positive integer", "body.max_tokens")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise LineInvalid("invalid_request", "at least one message is required", "body.messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise LineInvalid("invalid_request", "Input should be 'user' or 'assistant'",
                              f"body.messages[{i}].role")
        content = message.get("content")
        if not isinstance(content, str | list):
            raise LineInvalid("invalid_request", "Field required", f"body.messages[{i}].content")
    system = body.get("system")
    if system is not None and not isinstance(system, str | list):
        raise LineInvalid("invalid_request", "Input should be a string or a list of text blocks",
                          "body.system")
    stops = body.get("stop_sequences")
    if stops is not None and (not isinstance(stops, list) or not all(isinstance(x, str) for x in stops)):
        raise LineInvalid("invalid_request", "Input should be a list of strings",
                          "body.stop_sequences")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise LineInvalid("invalid_request", "Input should be a list", "body.tools")
    choice = body.get("tool_choice")
    kind = choice.get("type") if isinstance(choice, dict) else None
    if choice is not None and kind not in (*_ANTHROPIC_CHOICE, "tool"):
        raise LineInvalid("invalid_request", "Input should be an object whose type is 'auto', 'any', "
                          "'tool' or 'none'", "body.tool_choice")
    as_openai = _ANTHROPIC_CHOICE.get(kind or "auto", choice) if isinstance(choice, dict) else "auto"
    check_tools(spec, {"tools": tools, "tool_choice": as_openai} if tools else {})
    return cap


def check_template_kwargs(body: dict[str, Any]) -> None:
    """`chat_template_kwargs` (vLLM's extension, e.g. {"enable_thinking": false}) go to the template as-is."""
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise LineInvalid("invalid_request", "'chat_template_kwargs' must be a JSON object, e.g. "
                          '{"enable_thinking": false}.', "body.chat_template_kwargs")


def estimate_tokens(line_bytes: int) -> int:
    """About four bytes of request line per prompt token: only sizes shards and queue limits, so cheap wins."""
    return line_bytes // 4 + 1


def estimate_tokens_each(line_bytes: list[int], plus: int = 0) -> list[int]:
    """estimate_tokens of each line, `plus` added to each, without a call per line (Validate's blocks)."""
    k = 4 * (1 + plus)  # n // 4 + 1 + plus, in one addition and a shift (n >= 0)
    return [(n + k) >> 2 for n in line_bytes]
