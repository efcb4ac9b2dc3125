"""Reasoning models: the settings become the engine args vLLM expects, `chat_template_kwargs` pass through, and
reasoning tokens are counted in the batch's usage (no reasoning model is at hand locally)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gpu_worker.engines.vllm_args import cli_namespace, split_args
from nightbatch.models.spec import ModelSpec
from nightbatch.results.lines import Tally, summarize_result_line
from nightbatch.settings import Settings
from nightbatch.validation.invalid import LineInvalid
from nightbatch.validation.lines import Validator

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")

QWEN3 = ModelSpec(name="Qwen3-8B", source="hf:Qwen/Qwen3-8B", reasoning_parser="qwen3",
                  tool_call_parser="hermes", enable_auto_tool_choice=True,
                  default_chat_template_kwargs={"enable_thinking": False})


def test_reasoning_parser_reaches_the_structured_outputs_config_the_serving_classes_read() -> None:
    engine, frontend = split_args(QWEN3, Path("/models/q"), on_cpu=False)
    assert engine.reasoning_parser == "qwen3"
    # vLLM merges the flag into structured_outputs_config while building its config (create_engine_config);
    # init_app_state then reads args.structured_outputs_config.reasoning_parser for every serving class.
    engine.create_structured_outputs_config()
    args = cli_namespace(engine, frontend)
    assert args.structured_outputs_config.reasoning_parser == "qwen3"
    assert args.default_chat_template_kwargs == {"enable_thinking": False}
    assert (args.tool_call_parser, args.enable_auto_tool_choice) == ("hermes", True)


def test_no_reasoning_parser_by_default() -> None:
    engine, frontend = split_args(ModelSpec(name="m", source="hf:a/b"), Path("/m"), on_cpu=False)
    assert not engine.create_structured_outputs_config().reasoning_parser
    assert frontend.default_chat_template_kwargs is None


@pytest.mark.parametrize("fields, message", [
    ({"reasoning_parser": "no-such-parser"}, "reasoning_parser 'no-such-parser' is not one of vLLM's"),
    ({"tool_call_parser": "no-such-parser"}, "tool_call_parser 'no-such-parser' is not one of vLLM's"),
    ({"reasoning_parser": "qwen3", "engine_args": {"reasoning_parser": "x"}}, "model's own setting"),
])
def test_unknown_parsers_and_double_settings_are_refused_before_vllm_starts(fields: dict[str, Any],
                                                                            message: str) -> None:
    with pytest.raises(ValueError, match=message):
        split_args(ModelSpec(name="m", source="hf:a/b", **fields), Path("/m"), on_cpu=False)


def test_embedding_models_take_no_reasoning_parser() -> None:
    with pytest.raises(ValidationError, match="no tool or reasoning settings"):
        ModelSpec(name="e", source="hf:a/b", task="embed", reasoning_parser="qwen3")


def test_settings_round_trip_through_models_json() -> None:
    parsed = Settings(serving={"models_json": json.dumps([QWEN3.model_dump(mode="json")])}).serving.model(
        "Qwen3-8B")
    assert parsed == QWEN3


def line(**body: Any) -> bytes:
    return json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": "Qwen3-8B", "messages": [{"role": "user", "content": "2+2?"}], **body}}).encode()


def test_chat_template_kwargs_pass_validation_as_they_are() -> None:
    validator = Validator(settings=Settings(serving={"models_json": json.dumps([QWEN3.model_dump(mode="json")])}),
                          endpoint="/v1/chat/completions")
    data = line(chat_template_kwargs={"enable_thinking": True})
    assert validator.check(1, data, len(data)).body["chat_template_kwargs"] == {"enable_thinking": True}
    bad = line(chat_template_kwargs="think")
    with pytest.raises(LineInvalid) as info:
        validator.check(2, bad.replace(b'"a"', b'"b"', 1), len(bad))
    assert info.value.error[2] == "body.chat_template_kwargs"


def test_reasoning_tokens_are_counted_in_the_batch_usage() -> None:
    # A chat.completion body as vLLM returns it with a reasoning parser: `reasoning` beside `content`, and the
    # reasoning tokens in completion_tokens_details (part of completion_tokens).
    body = {"id": "chatcmpl-1", "object": "chat.completion", "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": "4", "reasoning": "2+2 is 4."}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21,
                      "completion_tokens_details": {"reasoning_tokens": 7}}}
    data = json.dumps({"id": "batch_req_1", "custom_id": "a", "response": {"status_code": 200,
                       "request_id": "r", "body": body}, "error": None}, separators=(",", ":")).encode()
    tally = Tally()
    tally.add_success(summarize_result_line(data).usage)
    tally.add_success(summarize_result_line(data).usage)
    assert tally.usage() == {"input_tokens": 24, "input_tokens_details": {"cached_tokens": 0},
                             "output_tokens": 18, "output_tokens_details": {"reasoning_tokens": 14},
                             "total_tokens": 42}


def test_the_cli_shows_reasoning_tokens_when_there_are_some() -> None:
    from openai.types import Batch

    from nightbatch.cli.render import tokens

    def batch(reasoning: int) -> Batch:
        return Batch.model_validate({
            "id": "batch_1", "object": "batch", "endpoint": "/v1/chat/completions", "input_file_id": "file-1",
            "completion_window": "24h", "status": "completed", "created_at": 1_700_000_000,
            "usage": {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 30,
                      "output_tokens_details": {"reasoning_tokens": reasoning}, "total_tokens": 40}})

    assert tokens(batch(0)) == "40 (input 10, output 30)"
    assert tokens(batch(25)) == "40 (input 10, output 30, of which reasoning 25)"
