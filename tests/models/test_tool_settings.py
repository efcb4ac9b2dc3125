"""Tool-calling settings: the model settings, the vLLM server args they become, the chat template, and the
per-line check that names the setting a model lacks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gpu_worker.engines.vllm_args import split_args
from infra.config import DeployConfig
from nightbatch.models.spec import LOCAL_MODELS, ModelSpec
from nightbatch.models.templates import DIRECTORY, resolve_chat_template
from nightbatch.settings import Settings
from nightbatch.validation.invalid import LineInvalid
from nightbatch.validation.lines import Validator

ROOT = Path(__file__).resolve().parents[2]
# vLLM imports torch, which warns on import.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
SMOL = next(m for m in LOCAL_MODELS if m.task == "generate")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def args(spec: ModelSpec) -> tuple[Any, Any]:
    return split_args(spec, Path("/models/x"), on_cpu=True)


def test_local_chat_model_is_configured_for_tools_with_our_template() -> None:
    engine, frontend = args(SMOL)
    assert frontend.tool_call_parser == "hermes"
    assert frontend.enable_auto_tool_choice is True
    assert frontend.enable_prompt_tokens_details is True  # cached_tokens in usage: the prompt-cache hit rate
    assert frontend.chat_template == str(DIRECTORY / "smollm2_tools.jinja")
    assert Path(frontend.chat_template).is_file()
    assert frontend.tool_strict_level == "parameter"  # arguments forced to the function's schema
    assert engine.served_model_name == [SMOL.name]


def test_a_model_without_tool_settings_gets_vllms_defaults() -> None:
    _, frontend = args(ModelSpec(name="m", source="hf:a/b"))
    assert frontend.tool_call_parser is None
    assert frontend.enable_auto_tool_choice is False
    assert frontend.chat_template is None


def test_inline_and_path_templates_pass_through() -> None:
    inline = "{% for m in messages %}{{ m.content }}{% endfor %}"
    assert args(ModelSpec(name="m", source="hf:a/b", chat_template=inline))[1].chat_template == inline
    assert args(ModelSpec(name="m", source="hf:a/b", chat_template="/t.jinja"))[1].chat_template == "/t.jinja"


def test_tool_settings_may_not_also_be_engine_args() -> None:
    spec = ModelSpec(name="m", source="hf:a/b", tool_call_parser="hermes", engine_args={"tool_call_parser": "x"})
    with pytest.raises(ValueError, match="model's own setting"):
        args(spec)


@pytest.mark.parametrize("fields, message", [
    ({"enable_auto_tool_choice": True}, "needs tool_call_parser"),
    ({"task": "embed", "tool_call_parser": "hermes"}, "no tool or reasoning settings"),
    ({"chat_template": "nightbatch:nope.jinja"}, "not a template shipped"),
    ({"chat_template": "nightbatch:../settings.py"}, "not a template shipped"),
])
def test_bad_model_settings_are_refused(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ModelSpec(name="m", source="hf:a/b", **fields)


def test_nightbatch_templates_resolve_to_shipped_files() -> None:
    assert resolve_chat_template(None) is None
    assert resolve_chat_template("nightbatch:smollm2_tools.jinja") == str(DIRECTORY / "smollm2_tools.jinja")


def test_aws_defaults_serve_qwen_with_the_hermes_parser_and_auto_tool_choice() -> None:
    context = json.loads((ROOT / "cdk.json").read_text())["context"]
    config = DeployConfig.from_context(context.get)
    qwen = next(m.spec for m in config.models if m.spec.name == "Qwen2.5-7B-Instruct")
    assert (qwen.tool_call_parser, qwen.enable_auto_tool_choice) == ("hermes", True)
    parsed = Settings(serving={"models_json": config.models_json}).serving.model("Qwen2.5-7B-Instruct")
    assert parsed is not None and parsed.tool_call_parser == "hermes"
    _, frontend = args(parsed)
    assert (frontend.tool_call_parser, frontend.enable_auto_tool_choice) == ("hermes", True)


def test_aws_refuses_a_chat_template_path() -> None:
    with pytest.raises(ValidationError, match="worker image"):
        DeployConfig.model_validate({"models": [{"name": "m", "source": "hf:a/b", "chat_template": "/t.jinja"}]})
    DeployConfig.model_validate({"models": [{"name": "m", "source": "hf:a/b", "chat_template": "nightbatch:"
                                             "smollm2_tools.jinja"}]})


def test_template_renders_tools_calls_and_results_and_is_the_shipped_one_without_tools() -> None:
    jinja2 = pytest.importorskip("jinja2")
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda v: json.dumps(v, ensure_ascii=False)
    template = env.from_string((DIRECTORY / "smollm2_tools.jinja").read_text())
    plain = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
             {"role": "user", "content": "q"}]
    assert template.render(messages=plain, add_generation_prompt=True) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n<|im_start|>user\nq<|im_end|>\n"
        "<|im_start|>assistant\n")
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "18C"},
    ]
    text = template.render(messages=history, tools=[WEATHER], add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n")
    assert json.dumps(WEATHER["function"]) in text
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n' \
           "</tool_call><|im_end|>\n" in text
    assert "<|im_start|>tool\n<tool_response>\n18C\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")


def chat(**body: Any) -> bytes:
    return json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": "m", "messages": [{"role": "user", "content": "Weather in Paris?"}], **body}}).encode()


def validator(**spec: Any) -> Validator:
    models = [{"name": "m", "source": "hf:a/b", **spec}]
    return Validator(settings=Settings(serving={"models_json": json.dumps(models)}), endpoint="/v1/chat/completions")


@pytest.mark.parametrize("body", [
    {"tools": [WEATHER]},
    {"tools": [WEATHER], "tool_choice": "required"},
    {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
])
def test_tools_on_a_model_without_a_parser_name_the_setting(body: dict[str, Any]) -> None:
    data = chat(**body)
    with pytest.raises(LineInvalid) as info:
        validator().check(1, data, len(data))
    code, message, param = info.value.error
    assert (code, param) == ("tools_unsupported", "body.tools")
    assert "`tool_call_parser`" in message and "'m'" in message


def test_auto_tool_choice_without_the_setting_names_it() -> None:
    data = chat(tools=[WEATHER])
    with pytest.raises(LineInvalid) as info:
        validator(tool_call_parser="hermes").check(1, data, len(data))
    code, message, param = info.value.error
    assert (code, param) == ("tools_unsupported", "body.tool_choice")
    assert "`enable_auto_tool_choice`" in message


@pytest.mark.parametrize("spec, body", [
    ({}, {}),
    ({}, {"tools": [WEATHER], "tool_choice": "none"}),
    ({"tool_call_parser": "hermes"}, {"tools": [WEATHER], "tool_choice": "required"}),
    ({"tool_call_parser": "hermes"}, {"tools": [WEATHER], "tool_choice": {
        "type": "function", "function": {"name": "get_weather"}}}),
    ({"tool_call_parser": "hermes", "enable_auto_tool_choice": True}, {"tools": [WEATHER]}),
])
def test_lines_the_model_can_answer_pass(spec: dict[str, Any], body: dict[str, Any]) -> None:
    data = chat(**body)
    assert validator(**spec).check(1, data, len(data)).custom_id == "a"
